"""A decay counted from step 0 under its warmup (diag/invariants.py decay_jumps_after_warmup).

microsoft/Swin-Transformer#277, PaddleDetection PR 4611: the cosine's progress ran from the
run's start, so where the warmup ended the LR fell at once to where a cosine started at step 0
would be. Read on the LR after each step, against the schedules in use as their libraries
ship them (torch's OneCycleLR and CosineAnnealingLR, transformers' warmup schedules, a warmup
then a constant LR), and through the probe of a plain loop."""

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

from hyprun.diag.invariants import decay_jumps_after_warmup
from hyprun.diag.live_checks import LiveFacts
from tests.helpers import finding_ids, probed_checks

STEPS, WARMUP, LR = 200, 24, 3e-3
CHECK = "decay_restarts_after_warmup"


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
}


def lrs_of(name: str) -> list[float]:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = SCHEDULES[name](optimizer)
    lrs = []
    for _ in range(STEPS - 1):
        optimizer.step()
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    return lrs


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedules_as_shipped_pass_and_a_decay_from_zero_fails(name):
    assert bool(decay_jumps_after_warmup(lrs_of(name))) == name.startswith("bug")


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


def test_the_violation_is_the_finding_of_its_id():
    facts = LiveFacts(
        optimizer="AdamW", peak_lr=LR, first_lr=LR / WARMUP, second_lr=2 * LR / WARMUP
    )
    facts.lrs = lrs_of("bug: cosine from 0")
    assert CHECK in finding_ids(facts)[:1]
