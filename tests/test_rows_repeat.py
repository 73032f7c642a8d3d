"""Rows repeated within the epoch a loop declares (diag/invariants.py rows_repeat;
huggingface/trl#467, huggingface/datasets#3423).

Within an epoch each row comes once. A training set filtered down to a few rows, or loader
workers that each replay the whole stream, make the first epoch's steps read the same rows
again. Through the probe of a plain loop that declares an epoch of 16 steps: a shuffled pass
over 64 rows passes, as does one drawn with replacement; the same 8 rows cycled fail; and a
loop that declares no epoch is not judged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import probed_checks

VOCAB, SEQ, WIDTH, BATCH, EPOCH_STEPS = 32, 8, 16, 4, 16
CHECK = "rows_repeat_within_epoch"


def loss_of(model: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    logits = model(rows[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())


def batches(data: str) -> list[torch.Tensor]:
    """EPOCH_STEPS batches of BATCH rows: a shuffled pass over 64 rows, 64 draws with
    replacement, or 8 rows cycled (a filter that kept 8)."""
    rows = torch.randint(VOCAB, (64, SEQ + 1), generator=torch.Generator().manual_seed(0))
    order = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    if data == "with_replacement":
        order = torch.randint(64, (64,), generator=torch.Generator().manual_seed(1))
    elif data == "eight_rows":
        order = torch.arange(64) % 8
    return list(rows[order].split(BATCH))


@pytest.mark.parametrize(
    ("data", "epoch_steps", "status"),
    [
        ("shuffled", EPOCH_STEPS, "pass"),
        ("with_replacement", EPOCH_STEPS, "pass"),
        ("eight_rows", EPOCH_STEPS, "fail"),
        ("eight_rows", None, "skip"),
    ],
)
def test_rows_repeated_within_the_declared_epoch_fail(uri, data, epoch_steps, status):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    heldout = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(9))
    checks = probed_checks(
        model, optimizer, loss_of, batches(data), heldout, epoch_steps=epoch_steps
    )
    assert checks[CHECK]["status"] == status, checks[CHECK]
