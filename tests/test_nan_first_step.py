"""A NaN before the first update is not the LR (diag/tables/convergence.yaml
nan_before_first_update).

A causal mask built with `triu(diagonal=0)` instead of `diagonal=1` masks every key of the
first query, whose softmax is then 0/0 (pbloem/former#10): the loss is NaN on the initial
weights. The explosion rows' LR and clipping cards cannot change a forward no update has touched,
so the finding offers precision alone. A weight poisoned after two updates is a later NaN and
keeps nan_in_module. Through the probe of a plain loop, and the built-in job's own loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mlflow.tracking import MlflowClient
from torch import nn

from hyprun.diag.evidence import NAN_UPDATES_TAG
from hyprun.runner.control.diagnose import diagnose
from hyprun.runner.job.probe import Probe

VOCAB, WIDTH, SEQ, STEPS = 32, 16, 8, 6


class Attention(nn.Module):
    """One causal self-attention layer on an embedding, and a head."""

    def __init__(self, diagonal: int):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.qkv, self.head = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", torch.ones(SEQ, SEQ, dtype=torch.bool).triu(diagonal))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = (q @ k.transpose(-2, -1)) / WIDTH**0.5
        weights = scores.masked_fill(self.mask, float("-inf")).softmax(-1)
        return self.head(h + weights @ v)


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model: nn.Module, pair) -> torch.Tensor:
    x, y = pair
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def diagnosed(
    uri: str, diagonal: int, poison_after: int | None = None, stops: bool = True
) -> tuple[dict, dict]:
    """(run tags, diagnosis) of a probed AdamW loop that stops at its first NaN loss, or
    (`stops=False`) steps on to its budget as a loop that never reads `diverged` does."""
    model = Attention(diagonal)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = Probe(model, optimizer, step_unit="steps", every_steps=2, loss_fn=loss_of)
    for step in range(STEPS):
        loss = loss_of(model, batch(step))
        loss.backward()
        probe.after_backward(loss)
        if probe.diverged and stops:
            break
        optimizer.step()
        optimizer.zero_grad()
        if step + 1 == poison_after:
            with torch.no_grad():
                model.qkv.weight[0, 0] = float("inf")
    probe.close()
    tags = MlflowClient(uri).get_run(probe.run_id).data.tags
    return tags, diagnose(uri, probe.run_id, "hyprun")[1]


@pytest.mark.parametrize("stops", [True, False])
def test_a_mask_over_every_key_of_a_row_is_a_nan_before_any_update(uri, stops):
    tags, document = diagnosed(uri, diagonal=0, stops=stops)
    assert tags["hyprun.outcome"] == "diverged" and tags[NAN_UPDATES_TAG] == "0"
    top = document["findings"][0]
    assert top["id"] == "nan_before_first_update"
    cards = {card for finding in document["findings"] for card in finding["cards"]}
    assert not cards & {"lr_down_10x", "grad_clip"}, cards


def test_a_nan_after_two_updates_stays_in_its_module_and_a_sound_mask_trains(uri):
    tags, document = diagnosed(uri, diagonal=1, poison_after=2)
    assert tags[NAN_UPDATES_TAG] == "2"
    ids = [finding["id"] for finding in document["findings"]]
    assert ids[0] == "nan_in_module" and "nan_before_first_update" not in ids
    tags, document = diagnosed(uri, diagonal=1)
    assert tags["hyprun.outcome"] == "completed" and NAN_UPDATES_TAG not in tags
