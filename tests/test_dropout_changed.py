"""A dropout rate written to the module during the run (diag/invariants.py dropout_changed;
NVIDIA/Megatron-LM PR 411).

An attention that sets its own dropout rate to 0 when it runs in eval mode keeps it at 0 once
training resumes: after the first evaluation it trains without the dropout its config declares.
Through the probe of a plain loop that evaluates once: that attention fails, one that keeps the
eval rate a local value passes, as does an nn.Dropout model, and a model with no dropout rate is
not judged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyprun.runner.job.probe import Probe
from tests.helpers import probe_checks

VOCAB, SEQ, WIDTH, STEPS = 32, 8, 16, 8
CHECK = "dropout_rate_changed"


class Mixer(nn.Module):
    """A linear map with dropout at `dropout_p`; `writes_eval_rate`: the eval-mode rate 0 is
    written to the module (the fault), else kept a local value."""

    def __init__(self, dropout_p: float, writes_eval_rate: bool):
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.dropout_p, self.writes_eval_rate = dropout_p, writes_eval_rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.writes_eval_rate and not self.training:
            self.dropout_p = 0.0
        rate = self.dropout_p if self.training else 0.0
        return x + F.dropout(self.linear(x), rate, self.training)


def model_of(kind: str) -> nn.Module:
    middle = {
        "writes_eval_rate": Mixer(0.1, writes_eval_rate=True),
        "local_eval_rate": Mixer(0.1, writes_eval_rate=False),
        "dropout_module": nn.Dropout(0.1),
        "no_dropout": nn.Identity(),
    }[kind]
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH), middle, nn.Linear(WIDTH, VOCAB))


def batch(seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def loss_of(model: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    logits = model(rows[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())


def run(kind: str) -> dict:
    """STEPS steps, probed every 2, with an evaluation after the third."""
    torch.manual_seed(0)
    model = model_of(kind)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = Probe(model, optimizer, step_unit="steps", every_steps=2)
    for step in range(STEPS):
        loss = loss_of(model, batch(step))
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step == 2:
            model.eval()
            with torch.no_grad():
                loss_of(model, batch(99))
            model.train()
    probe.close()
    return probe_checks(probe.run_id)[CHECK]


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        ("writes_eval_rate", "fail"),
        ("local_eval_rate", "pass"),
        ("dropout_module", "pass"),
        ("no_dropout", "skip"),
    ],
)
def test_a_dropout_rate_changed_by_an_evaluation_fails(uri, kind, status):
    check = run(kind)
    assert check["status"] == status, check
