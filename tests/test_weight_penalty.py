"""A penalty on the weights' norm that outweighs the data's gradient (diag/invariants.py
gradient_along_weights; RUCAIBox/RecBole#872: loss + wd x sum(w**2) beside AdamW's own decay).

Through the probe of a plain loop: a cross-entropy's gradient points across the weights (its
median cosine with them near 0) and passes, and so does a small L2 term; an L2 term of 0.1 x the
sum of every squared weight points the gradient at the weights and fails."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import probed_checks

VOCAB, SEQ, WIDTH = 256, 32, 64
CHECK = "gradient_along_weights"


def batch(seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (16, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def check(penalty: float) -> dict:
    """The check on 6 AdamW steps, the loss plus `penalty` x the sum of squared weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB))

    def loss_of(net: nn.Module, rows: torch.Tensor) -> torch.Tensor:
        logits = net(rows[:, :-1])
        data = F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())
        return data + penalty * sum(p.pow(2).sum() for p in net.parameters())

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    batches = [batch(seed) for seed in range(6)]
    return probed_checks(model, optimizer, loss_of, batches, batch(99))[CHECK]


@pytest.mark.parametrize(
    ("penalty", "status"), [(0.0, "pass"), (1e-6, "pass"), (0.1, "fail")], ids=str
)
def test_a_penalty_outweighing_the_data_fails(uri, penalty, status):
    read = check(penalty)
    assert read["status"] == status, read
