"""An LR scheduler that steps more often than its optimizer, or at two periods (diag/invariants.py
scheduler_outpaces_optimizer, scheduler_period_broken).

Stepped per micro-batch under gradient accumulation, the schedule runs accumulation times
ahead of training; left on the optimizer a resumed loop replaced (EleutherAI/gpt-neox#1029), it
steps an optimizer that no longer trains; a per-epoch StepLR also stepped by the evaluation pass
(NVlabs/PALAVRA#4) decays early. Through the probe of a plain loop: a per-step schedule stepped
per micro-batch and per optimizer step (some optimizer steps skipped, as an fp16 scaler skips
them), a per-epoch StepLR alone and also stepped at each evaluation, ReduceLROnPlateau at each
evaluation, a scheduler resumed from a long run (its count loaded, not taken here), and an
optimizer swapped mid-run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyprun.diag.invariants import scheduler_period_broken
from hyprun.diag.live_checks import LiveFacts
from hyprun.runner.job.probe import Probe
from tests.helpers import finding_ids, probe_checks

VOCAB, SEQ, WIDTH, STEPS, ACCUMULATION = 32, 8, 16, 24, 4
EPOCH, EVAL = 4, 6
CHECK, PERIOD = "scheduler_outpaces_optimizer", "scheduler_stepped_off_period"


def batch(seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def loss_of(model: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    logits = model(rows[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())


def run(how: str, check: str = CHECK) -> dict:
    """STEPS optimizer steps of ACCUMULATION micro-batches each, the scheduler stepped `how`."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    total = STEPS * ACCUMULATION
    if how in ("per_epoch", "per_epoch_and_eval"):
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    elif how == "plateau_per_eval":
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / (2 * total))
    if how == "resumed":  # a scheduler's count loaded from a long run before this one
        for _ in range(100):
            scheduler.step()
    probe = Probe(model, optimizer, step_unit="steps", every_steps=4, heldout=batch(99))
    probe.loss_fn = loss_of
    trained = optimizer
    for step in range(STEPS):
        for micro in range(ACCUMULATION):
            loss = loss_of(model, batch(step * ACCUMULATION + micro)) / ACCUMULATION
            loss.backward()
            probe.after_backward(loss)
            if how == "per_micro_batch":
                scheduler.step()
        if not (how == "per_step_skipping" and step % 5 == 2):
            trained.step()
        trained.zero_grad()
        if how in ("per_step", "per_step_skipping", "resumed", "swapped"):
            scheduler.step()
        if how.startswith("per_epoch") and step % EPOCH == EPOCH - 1:
            scheduler.step()
        if how == "per_epoch_and_eval" and step % EVAL == EVAL - 1:
            scheduler.step()  # the epoch routine ending in scheduler.step(), run to evaluate
        if how == "plateau_per_eval" and step % EVAL == EVAL - 1:
            scheduler.step(float(loss))
        if how == "swapped" and step == 7:  # a resume builds a new optimizer; the scheduler
            trained = torch.optim.AdamW(model.parameters(), lr=1e-3)  # stays on the old one
            trained.load_state_dict(optimizer.state_dict())
    probe.close()
    return probe_checks(probe.run_id)[check]


@pytest.mark.parametrize(
    ("how", "status"),
    [
        ("per_micro_batch", "fail"),
        ("per_step", "pass"),
        ("per_epoch", "pass"),
        ("resumed", "pass"),
        ("swapped", "fail"),
    ],
)
def test_a_scheduler_stepped_more_often_than_its_optimizer_fails(uri, how, status):
    check = run(how)
    assert check["status"] == status, check


@pytest.mark.parametrize(
    ("how", "status"),
    [
        ("per_epoch_and_eval", "fail"),
        ("per_epoch", "pass"),
        ("plateau_per_eval", "pass"),
        ("per_step", "skip"),  # every step: the pace check's to judge
        ("per_step_skipping", "skip"),
    ],
)
def test_a_scheduler_stepped_at_two_periods_fails(uri, how, status):
    check = run(how, PERIOD)
    assert check["status"] == status, check


def test_the_violation_is_the_finding_of_its_id():
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    facts.scheduler_lead = (96, 24)
    assert finding_ids(facts) == [CHECK]


def test_two_periods_are_the_finding_of_their_id():
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-3, second_lr=1e-3)
    facts.scheduler_advances = {"StepLR": [40, 80, 120, 128, 160, 200]}
    assert finding_ids(facts) == [PERIOD]


def test_an_epoch_rounded_to_whole_windows_keeps_its_period():
    """Epochs of 10.5 optimizer steps (an accumulation window carried over) keep one period;
    two steps at once in a per-epoch scheduler do not."""
    assert not scheduler_period_broken({"StepLR": [10, 21, 31, 42, 52]})
    assert scheduler_period_broken({"StepLR": [10, 20, 20, 30]})
