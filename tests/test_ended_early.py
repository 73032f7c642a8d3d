"""A run that ends short of the optimizer steps it declared (diag/invariants.py ended_early;
avinashpaliwal/Super-SloMo#3).

A `break` left in the loop or a data iterator never restarted ends training early, silently:
the last eval reads an unfinished model. Through the probe of a plain loop told its steps:
all of them taken passes, a third of them fails, a run of unknown length is not judged, and
neither is one that hyprun asked to stop."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyprun.runner.job import stop
from hyprun.runner.job.probe import Probe
from tests.helpers import probe_checks

VOCAB, SEQ, WIDTH, STEPS = 32, 8, 16, 12
CHECK = "run_ended_early"


def batch(seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def loss_of(model: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    logits = model(rows[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())


def run(taken: int, declared: int | None, stop_at: int | None = None) -> dict:
    """`taken` steps of a loop that declares `declared`; hyprun asks it to stop at `stop_at`."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = Probe(model, optimizer, step_unit="steps", every_steps=4, total_steps=declared)
    try:
        for step in range(taken):
            if step == stop_at:
                stop.request()  # as hyprun's watch thread asks: the probe ends the loop
            loss = loss_of(model, batch(step))
            loss.backward()
            probe.after_backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    except stop.StopRequested:
        pass
    finally:
        probe.close()
    return probe_checks(probe.run_id)[CHECK]


@pytest.mark.parametrize(
    ("taken", "declared", "status"),
    [(STEPS, STEPS, "pass"), (STEPS // 3, STEPS, "fail"), (STEPS // 3, None, "skip")],
)
def test_a_run_short_of_its_declared_steps_fails(uri, taken, declared, status):
    check = run(taken, declared)
    assert check["status"] == status, check


def test_a_run_hyprun_stopped_is_not_judged(uri, monkeypatch):
    monkeypatch.setattr(stop, "_flag", threading.Event())  # this test's own stop flag
    assert run(STEPS, STEPS, stop_at=STEPS // 3)["status"] == "skip"
