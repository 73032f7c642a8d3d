"""Two slips in a warmup's shape (diag/invariants.py decay_jumps_after_warmup, steps_at_zero_lr).

A decay counted from step 0 under its warmup (microsoft/Swin-Transformer#277, PaddleDetection
PR 4611): where the warmup ended the LR fell at once to where a cosine started at step 0 would
be. A warmup factor in integer division (facebookresearch/maskrcnn-benchmark#335): (step + 1) //
warmup is 0 until the warmup's last step, so those steps train nothing. Read on the LR each
step applied, against the schedules in use as their libraries ship them (torch's OneCycleLR,
LinearLR and CosineAnnealingLR, transformers' warmup schedules), and through the probe of a
plain loop."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_inverse_sqrt_schedule,
    get_linear_schedule_with_warmup,
)

from hyprun.diag.invariants import decay_jumps_after_warmup, steps_at_zero_lr
from hyprun.diag.live_checks import LiveFacts
from tests.helpers import finding_ids, probed_checks

STEPS, WARMUP, LR = 200, 24, 3e-3
CHECK = "decay_restarts_after_warmup"
ZERO = "warmup_starts_at_zero"


def cosine_from(start: int):
    """A linear warmup, then a cosine whose progress counts from `start` (the warmup's end:
    correct; 0: the bug)."""

    def factor(step: int) -> float:
        if step < WARMUP:
            return (step + 1) / WARMUP
        return 0.5 * (1 + math.cos(math.pi * (step - start) / (STEPS - start)))

    return factor


def linear_from(start: int):
    def factor(step: int) -> float:
        return (step + 1) / WARMUP if step < WARMUP else (STEPS - step) / (STEPS - start)

    return factor


SCHEDULES = {
    "cosine": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, cosine_from(WARMUP)),
    "linear": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, linear_from(WARMUP)),
    "hf cosine": lambda opt: get_cosine_schedule_with_warmup(opt, WARMUP, STEPS),
    "hf linear": lambda opt: get_linear_schedule_with_warmup(opt, WARMUP, STEPS),
    "hf constant": lambda opt: get_constant_schedule_with_warmup(opt, WARMUP),
    "hf inverse sqrt": lambda opt: get_inverse_sqrt_schedule(opt, WARMUP),
    "one cycle": lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, LR, total_steps=STEPS),
    "cosine, no warmup": lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS),
    "bug: cosine from 0": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, cosine_from(0)),
    "bug: linear from 0": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, linear_from(0)),
    "bug: integer warmup": lambda opt: torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: min(1, (step + 1) // WARMUP)
    ),
    "linear lr": lambda opt: torch.optim.lr_scheduler.LinearLR(opt, total_iters=WARMUP),
}
"""Each schedule by name: a name that starts with "bug" is a slip, the others as shipped."""
DECAY_SLIPS = ("bug: cosine from 0", "bug: linear from 0")


def lrs_of(name: str) -> list[float]:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = SCHEDULES[name](optimizer)
    lrs = []
    for _ in range(STEPS - 1):
        lrs.append(optimizer.param_groups[0]["lr"])  # the LR this step applies
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedules_as_shipped_pass_and_each_slip_fails_its_own_check(name):
    lrs = lrs_of(name)
    assert bool(decay_jumps_after_warmup(lrs)) == (name in DECAY_SLIPS)
    assert bool(steps_at_zero_lr(lrs)) == (name == "bug: integer warmup")


def test_through_the_probe(uri):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_from(0))

    def loss_of(net, ids):
        return F.cross_entropy(net(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())

    batches = [torch.randint(16, (4, 9)) for _ in range(WARMUP + 6)]

    class Stepped(list):  # the scheduler stepped after each optimizer step, as loops do
        def __iter__(self):
            for item in super().__iter__():
                yield item
                scheduler.step()

    checks = probed_checks(model, optimizer, loss_of, Stepped(batches), batches[0])
    assert checks[CHECK]["status"] == "fail", checks[CHECK]


@pytest.mark.parametrize(
    ("name", "check"), [(DECAY_SLIPS[0], CHECK), ("bug: integer warmup", ZERO)]
)
def test_the_violation_is_the_finding_of_its_id(name, check):
    facts = LiveFacts(
        optimizer="AdamW", peak_lr=LR, first_lr=LR / WARMUP, second_lr=2 * LR / WARMUP
    )
    facts.lrs = lrs_of(name)
    assert finding_ids(facts)[:1] == [check]
