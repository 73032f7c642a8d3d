"""Adam's moments after its first step (diag/invariants.py adam_moments_misweighted;
runner/job/adam_step.py first_moments).

From zero, Adam's first step leaves m = (1 - beta1) g and v = (1 - beta2) g^2 exactly. A moment
update that drops its weight (fastai/fastbook PR 342: v = beta2 v + g^2) reads 1 / (1 - beta)
times that, every step then as if at another LR. Through the probe of a plain loop: torch's
AdamW and Adam and a hand-written AdamW pass, the hand-written one with either weight dropped
fails, and Adam with a coupled L2 decay (its gradient grows inside the step) is not read."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyprun.diag.live_checks import LiveFacts
from tests.helpers import finding_ids, probed_checks
from tests.test_adam_step_bound import MyAdamW

VOCAB, WIDTH, SEQ = 32, 16, 8
CHECK = "adam_moments_misweighted"


def batch(seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (8, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def loss_of(model: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())


@pytest.mark.parametrize(
    ("optimizer_of", "status"),
    [
        (lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1), "pass"),
        (lambda params: torch.optim.Adam(params, lr=1e-3), "pass"),
        (lambda params: MyAdamW(params), "pass"),
        (lambda params: MyAdamW(params, bug="second"), "fail"),
        (lambda params: MyAdamW(params, bug="first"), "fail"),
        (lambda params: torch.optim.Adam(params, lr=1e-3, weight_decay=0.1), "skip"),
        (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), "skip"),
    ],
)
def test_through_the_probe(uri, optimizer_of, status):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB))
    batches = [batch(seed) for seed in range(4)]
    checks = probed_checks(model, optimizer_of(model.parameters()), loss_of, batches, batch(99))
    assert checks[CHECK]["status"] == status, checks[CHECK]


def test_the_violation_is_the_finding_of_its_id():
    facts = LiveFacts(optimizer="MyAdamW", peak_lr=1e-3, first_lr=1e-3, second_lr=1e-3)
    facts.adam_moments = (1.0, 1000.0)
    assert finding_ids(facts)[:1] == [CHECK]
