"""Weights frozen by zeroing their gradients, still moved by the optimizer (diag/invariants.py
frozen_yet_moved; diffusers#1009, pytorch#38581).

A weight whose gradient is zero moves only by weight decay or momentum. Frozen by a hook that
zeroes its gradient while it stays in AdamW, the embedding still shrinks every step; without
weight decay it stays put; a LoRA-like adapter whose A gets a zero gradient at the first step
only (its B starts at zero) is not frozen. Through the probe of a plain loop and of a Lightning
fit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mlflow.tracking import MlflowClient
from torch import nn

from hyprun.diag.live_checks import read_l0_tags
from hyprun.runner.job.callbacks import HyprunLightningCallback
from tests.helpers import probed_checks
from tests.test_probe_lightning import TinyLM, fit

VOCAB, SEQ, WIDTH = 32, 8, 16
CHECK = "frozen_weights_decayed"


class Adapted(nn.Module):
    """Token embedding, a low-rank adapter (B zero at init, as LoRA's) and a head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.down = nn.Linear(WIDTH, 4, bias=False)
        self.up = nn.Linear(4, WIDTH, bias=False)
        nn.init.zeros_(self.up.weight)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        return self.head(x + self.up(self.down(x)))


def freeze_by_zeroing(parameter: nn.Parameter) -> None:
    """The reported freeze: every gradient of the weight replaced by zeros."""
    parameter.register_hook(torch.zeros_like)


def loss_of(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def batch(seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("frozen", "weight_decay", "status"),
    [(True, 0.1, "fail"), (True, 0.0, "pass"), (False, 0.1, "pass")],
)
def test_a_weight_frozen_by_a_zero_gradient_fails_only_where_decay_moves_it(
    uri, frozen, weight_decay, status
):
    torch.manual_seed(0)
    model = Adapted()
    if frozen:
        freeze_by_zeroing(model.embed.weight)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=weight_decay)
    batches = [batch(seed) for seed in range(8)]
    check = probed_checks(model, optimizer, loss_of, batches, batch(99))[CHECK]
    assert check["status"] == status, check
    if status == "fail":
        assert "embed.weight" in check["why"]


@pytest.mark.slow  # lightning's Trainer
def test_lightning_module_frozen_by_a_hook_fails(workdir, monkeypatch):
    """AdamW's default weight decay (0.01) moves an embedding a hook freezes."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/mlflow.db")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    torch.manual_seed(0)
    module = TinyLM()
    freeze_by_zeroing(module.embed.weight)
    callback = HyprunLightningCallback(every_steps=2)
    fit(module, [callback])
    run = MlflowClient(tracking_uri=f"sqlite:///{workdir}/mlflow.db").get_run(callback.probe.run_id)
    checks = {check["id"]: check for check in read_l0_tags(run.data.tags)}
    assert checks[CHECK]["status"] == "fail", checks[CHECK]
