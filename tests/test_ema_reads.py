"""An EMA of the weights updated wrongly (diag/invariants.py average_decay_wrong and
average_updated_per_micro_batch; runner/job/averages.py).

The probe finds the copy of the weights a loop keeps (a deepcopy, torch's AveragedModel, a dict
of shadow tensors) and reads it over single steps, without being told the decay: the decay a
step applied (an EMA keeps most of itself and moves toward the weights) and how many times it
changed per optimizer step (only when the weights do). Through the probe of a plain loop with
two micro-batches per step: a correct EMA passes both in each form, a flipped sign
(ostris/ai-toolkit#1034) and a decay given as the new weights' share (levanter PR 883) fail the
first, an update per micro-batch (SWivid/F5-TTS#631) fails the second, and a loop without an
EMA is not judged."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from hyprun.runner.job.probe import Probe
from tests.helpers import probe_checks

VOCAB, SEQ, WIDTH, STEPS, ACCUM, DECAY = 32, 8, 16, 8, 2, 0.9
CHECKS = ("ema_update_wrong", "ema_updated_per_micro_batch")


class ShadowModule:
    """An EMA kept as a deepcopy of the model; `kind` picks the update as written."""

    def __init__(self, model: nn.Module, kind: str):
        self.copy, self.kind = copy.deepcopy(model).requires_grad_(False), kind

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for shadow, weight in zip(self.copy.parameters(), model.parameters(), strict=True):
            gap = shadow - weight
            if self.kind == "sign_flipped":
                shadow.add_(gap * (1 - DECAY))
            elif self.kind == "beta_backwards":
                shadow.sub_(gap * DECAY)
            else:
                shadow.sub_(gap * (1 - DECAY))


class ShadowDict:
    """An EMA kept as a dict of tensors by parameter name."""

    def __init__(self, model: nn.Module):
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for name, weight in model.named_parameters():
            self.shadow[name].lerp_(weight, 1 - DECAY)


class Averaged:
    """torch's AveragedModel with its EMA function."""

    def __init__(self, model: nn.Module):
        self.copy = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(DECAY))

    def update(self, model: nn.Module) -> None:
        self.copy.update_parameters(model)


def batch(seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def loss_of(model: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    logits = model(rows[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())


def run(kind: str) -> dict[str, str]:
    """STEPS steps of ACCUM micro-batches with the EMA `kind`; the two checks' statuses."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    forms = {"none": lambda model: None, "dict": ShadowDict, "averaged_model": Averaged}
    ema = forms.get(kind, lambda model: ShadowModule(model, kind))(model)
    probe = Probe(model, optimizer, step_unit="steps", every_steps=2)
    for step in range(STEPS):
        for micro in range(ACCUM):
            loss = loss_of(model, batch(step * ACCUM + micro)) / ACCUM
            loss.backward()
            probe.after_backward(loss)
            if ema is not None and kind == "per_micro_batch":
                ema.update(model)
        optimizer.step()
        optimizer.zero_grad()
        if ema is not None and kind != "per_micro_batch":
            ema.update(model)
    probe.close()
    checks = probe_checks(probe.run_id)
    return {name: checks[name]["status"] for name in CHECKS}


@pytest.mark.parametrize(
    ("kind", "update_wrong", "per_micro_batch"),
    [
        ("healthy", "pass", "pass"),
        ("dict", "pass", "pass"),
        ("averaged_model", "pass", "pass"),
        ("sign_flipped", "fail", "pass"),
        ("beta_backwards", "fail", "pass"),
        ("per_micro_batch", "pass", "fail"),
        ("none", "skip", "skip"),
    ],
)
def test_an_ema_is_held_to_its_update(uri, kind, update_wrong, per_micro_batch):
    statuses = run(kind)
    assert statuses == dict(zip(CHECKS, (update_wrong, per_micro_batch), strict=True)), statuses
