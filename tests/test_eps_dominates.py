"""Adam's eps outweighing the gradients the optimizer really steps on (diag/invariants.py
eps_dominates; THUDM/slime PR 1842, mlpnlp/mlpnlp-nmt PR 4).

Read from the optimizer's state, after whatever the loop did to the gradients: fp16 gradients
divided by the loss scale a second time after unscaling reach AdamW 65536x too small, below its
eps, and every step shrinks. Through the probe of a plain loop: gradients as backward left them
pass, the same gradients divided by a loss scale twice fail, so does an eps of 1, and SGD is not
judged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import probed_checks

VOCAB, SEQ, WIDTH = 256, 32, 64
CHECK = "adam_eps_dominates"
LOSS_SCALE = 2.0**16  # GradScaler's initial scale


def batch(seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (16, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def loss_of(model: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    logits = model(rows[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())


def check(optimizer_of, shrink: float = 1.0) -> dict:
    """The check on 6 steps; the loss (so each gradient) multiplied by `shrink`, as a loss
    scale divided out of the gradients once more than it was multiplied in."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB))
    optimizer = optimizer_of(model.parameters())
    batches = [batch(seed) for seed in range(6)]

    def shrunk(net: nn.Module, rows: torch.Tensor) -> torch.Tensor:
        return loss_of(net, rows) * shrink

    return probed_checks(model, optimizer, shrunk, batches, batch(99))[CHECK]


@pytest.mark.parametrize(
    ("optimizer_of", "shrink", "status"),
    [
        (lambda params: torch.optim.AdamW(params, lr=1e-3), 1.0, "pass"),
        (lambda params: torch.optim.AdamW(params, lr=1e-3), 1 / LOSS_SCALE, "fail"),
        (lambda params: torch.optim.Adam(params, lr=1e-3, eps=1.0), 1.0, "fail"),
        (lambda params: torch.optim.SGD(params, lr=1e-1), 1.0, "skip"),
    ],
    ids=["healthy", "unscaled_twice", "eps_one", "sgd"],
)
def test_eps_above_the_stepped_gradients_fails(uri, optimizer_of, shrink, status):
    read = check(optimizer_of, shrink)
    assert read["status"] == status, read
