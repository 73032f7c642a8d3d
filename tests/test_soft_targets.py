"""Soft targets are distributions (runner/job/invariant_hooks.LossInputs, diag/invariants.py
soft_targets_unnormalised): a hand-written cross-entropy -sum(q log p) whose q rows do not sum
to 1 trains toward another target. Through the probe of a real loop: label smoothing written
right, written as TimDettmers/ConvE#55 wrote it, a teacher's probabilities into kl_div, and
losses that weigh no soft target; then into the finding named by the corpus cause id."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyprun.diag.evidence import Evidence
from hyprun.diag.triage import triage
from hyprun.runner.job.probe import Probe
from tests.helpers import probe_checks

VOCAB, WIDTH, EPS = 16, 10, 0.1


def smoothed(target: torch.Tensor, extra: float) -> torch.Tensor:
    """(1 - eps) one-hot + `extra` on every class: eps / K is right, 1 / K adds mass."""
    return (1 - EPS) * F.one_hot(target, VOCAB).float() + extra


LOSSES = {
    "right": lambda logits, y: -(smoothed(y, EPS / VOCAB) * logits.log_softmax(-1)).sum(-1).mean(),
    "mass_added": lambda logits, y: (
        -(smoothed(y, 1 / VOCAB) * logits.log_softmax(-1)).sum(-1).mean()
    ),
    "teacher": lambda logits, y: F.kl_div(
        logits.log_softmax(-1), torch.full_like(logits, 1 / VOCAB), reduction="batchmean"
    ),
    "focal": lambda logits, y: (
        -(
            (1 - logits.softmax(-1).gather(-1, y[:, None])) ** 2
            * logits.log_softmax(-1).gather(-1, y[:, None])
        ).mean()
    ),
    "builtin": lambda logits, y: F.cross_entropy(logits, y, label_smoothing=EPS),
}


def probed(loss_name: str) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def loss_of(net: nn.Module, pair) -> torch.Tensor:
        x, y = pair
        return LOSSES[loss_name](net(x).flatten(0, 1), y.flatten())

    tokens = torch.randint(VOCAB, (4, WIDTH + 1), generator=torch.Generator().manual_seed(1))
    pair = (tokens[:, :-1], tokens[:, 1:])
    probe = Probe(model, optimizer, step_unit="steps", every_steps=2, heldout=pair, loss_fn=loss_of)
    for _ in range(4):
        loss = loss_of(model, pair)
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    probe.close()
    return probe_checks(probe.run_id)["label_smoothing_wrong"]


@pytest.mark.parametrize(
    "loss_name, status",
    [("right", "pass"), ("teacher", "pass"), ("mass_added", "fail"), ("focal", "skip")]
    + [("builtin", "skip")],
)
def test_only_soft_targets_that_do_not_sum_to_one_fail(uri, loss_name, status):
    check = probed(loss_name)
    assert check["status"] == status, check
    if status == "fail":  # (1 - eps) + K x 1/K = 2 - eps
        assert "1 +- 0.9" in check["why"]
        finding = triage(Evidence(static=[check])).findings[0]
        assert finding.id == "label_smoothing_wrong" and finding.cards == []
