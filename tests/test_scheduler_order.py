"""An LR scheduler stepped before its optimizer's first step (diag/invariants.py
scheduler_stepped_first).

A trainer that steps a per-epoch StepLR when the epoch starts skips the schedule's first value:
every epoch trains at the next epoch's LR (michuanhaohao/reid-strong-baseline#190). Stepped at
the epoch's end it passes; so do a per-step warmup, a SequentialLR (whose constructor re-steps
its first child), and a resumed optimizer carrying its state. Through the probe of a plain loop;
the HF Trainer's own scheduler passes (tests/test_probe_hf.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import lr_scheduler

from hyprun.runner.job.probe import Probe
from tests.helpers import probe_checks

CHECK = "scheduler_stepped_before_optimizer"
EPOCHS, STEPS_PER_EPOCH = 3, 2


def schedule(kind: str, optimizer: torch.optim.Optimizer):
    if kind == "sequential":
        warm = lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=2)
        return lr_scheduler.SequentialLR(
            optimizer, [warm, lr_scheduler.StepLR(optimizer, 1, 0.5)], milestones=[2]
        )
    if kind == "warmup":
        return lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4))
    return lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def status(kind: str, resumed: bool = False) -> str:
    """The check on a probed Adam loop of EPOCHS epochs whose scheduler (`kind`) steps at the
    epoch's start ("epoch_start"), its end, or after each step ("warmup", "sequential")."""
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    if resumed:  # an optimizer restored from a checkpoint: its state says it has stepped
        model(torch.randn(2, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        saved = optimizer.state_dict()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        optimizer.load_state_dict(saved)
    scheduler = schedule(kind, optimizer)
    if resumed:
        scheduler.step()  # the restored scheduler's count is past its constructor's step
    probe = Probe(model, optimizer, step_unit="steps", every_steps=0)
    for epoch in range(EPOCHS):
        if kind == "epoch_start":
            scheduler.step()  # the bug: before this epoch's optimizer steps
        for step in range(STEPS_PER_EPOCH):
            x = torch.randn(16, 8, generator=torch.Generator().manual_seed(epoch * 10 + step))
            loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
            loss.backward()
            probe.after_backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if kind in ("warmup", "sequential"):
                scheduler.step()
        if kind == "epoch_end":
            scheduler.step()
    probe.close()
    return probe_checks(probe.run_id)[CHECK]["status"]


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")
def test_a_scheduler_stepped_before_the_optimizer_fails(uri):
    assert status("epoch_start") == "fail"


@pytest.mark.parametrize("kind", ["epoch_end", "warmup", "sequential"])
def test_schedulers_stepped_after_the_optimizer_pass(uri, kind):
    assert status(kind) == "pass"


def test_a_resumed_optimizer_is_not_judged(uri):
    assert status("epoch_end", resumed=True) == "skip"
