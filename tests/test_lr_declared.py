"""The LR that trains is the LR the config declares (diag/features.py lr_over_declared, the
finding lr_not_as_declared).

Through the probe of a real loop whose LambdaLR lambda returns the LR where a factor belongs
(lhoyer/MIC#60: the applied LR is the declared one squared), and whose optimizer was built
without the config's LR (torch's default instead); its healthy forms, a constant LR and a
warmup that ends and a layer-wise decay whose first group trains at a share of it, are quiet.
The declared LR is read in the app's own key through its knobs. And an LR below zero
(lr_schedule_negative): a linear decay past its horizon, not floored at 0 (transformers#132)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyprun.diag.triage import triage
from hyprun.runner.control.diagnose import read_evidence
from hyprun.runner.job.probe import Probe

DECLARED = 1e-2
KNOBS = {"optim.lr": {"key": "training.learning_rate", "default": 5e-5}}


def recorded_run(uri: str, bug: str) -> str:
    """A probed AdamW loop of 12 steps on a tiny regression; its run id."""
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    built = {} if bug == "default_lr" else {"lr": DECLARED}  # torch's default: 1e-3
    optimizer = torch.optim.AdamW(model.parameters(), **built)
    if bug == "layer_decay":  # facebookresearch/mae#216: group 0 at a share of the declared LR
        optimizer = torch.optim.AdamW(
            [{"params": [model.bias], "lr": DECLARED * 0.1}, {"params": [model.weight]}],
            lr=DECLARED,
        )
    factors = {
        "lambda_returns_lr": lambda step: DECLARED,  # MIC#60: an LR, not a factor
        "warmup": lambda step: min(1.0, (step + 1) / 4),
        # transformers#132: warmup_linear's 1 - step / t_total past a t_total of 6 of 12 steps
        "past_horizon": lambda step: 1.0 - step / 6,
        "floored": lambda step: max(0.0, 1.0 - step / 6),
    }
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factors.get(bug, lambda step: 1.0))
    return probed_run(model, optimizer, schedule)


def probed_run(model: nn.Module, optimizer, schedule) -> str:
    """12 probed steps of a tiny regression, the schedule stepped after each; the run id."""
    probe = Probe(model, optimizer, step_unit="steps", every_steps=0)
    for step in range(12):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step))
        loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
    probe.close()
    return probe.run_id


def findings(uri: str, bug: str, config: dict, tags: dict | None = None) -> list[str]:
    evidence, _ = read_evidence(uri, recorded_run(uri, bug))
    evidence = dataclasses.replace(evidence, config=config, tags={**evidence.tags, **(tags or {})})
    return [f.id for f in triage(evidence).findings]


@pytest.mark.parametrize(
    "bug, fires",
    [
        ("lambda_returns_lr", True),
        ("default_lr", True),
        ("", False),
        ("warmup", False),
        ("layer_decay", False),
    ],
)
def test_an_lr_other_than_the_declared_one_is_a_finding_and_a_schedule_is_not(uri, bug, fires):
    found = findings(uri, bug, {"optim": {"lr": DECLARED}})
    assert ("lr_not_as_declared" in found) == fires


def test_an_app_declares_its_lr_in_its_own_key_through_its_knobs(uri):
    tags = {"hyprun.knobs": json.dumps(KNOBS)}
    assert "lr_not_as_declared" not in findings(
        uri, "", {"training": {"learning_rate": DECLARED}}, tags
    )
    # the app's key unset: the knob's default (the Trainer's 5e-5) is what it declares
    assert "lr_not_as_declared" in findings(uri, "", {"training": {}}, tags)


@pytest.mark.parametrize("bug, fires", [("past_horizon", True), ("floored", False), ("", False)])
def test_an_lr_below_zero_is_a_finding_and_a_decay_floored_at_zero_is_not(uri, bug, fires):
    found = findings(uri, bug, {"optim": {"lr": DECLARED}})
    assert ("lr_schedule_negative" in found) == fires, found
    if fires:
        assert found[0] == "lr_schedule_negative"


def settings_findings(uri: str, decay: float, warmup: bool, declared: dict) -> list[str]:
    """Findings of a probed Adam loop (weight decay `decay`, a LambdaLR warmup or none) whose
    app declares `declared` in its own keys through the HF preset's knobs."""
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=DECLARED, weight_decay=decay)
    factor = (lambda step: min(1.0, (step + 1) / 4)) if warmup else (lambda step: 1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    evidence, _ = read_evidence(uri, probed_run(model, optimizer, schedule))
    knobs = {
        "optim.lr": {"key": "training.learning_rate"},
        "optim.weight_decay": {"key": "training.weight_decay", "default": 0.0},
        "sched.warmup_frac": {"key": "training.warmup_steps", "default": 0},
    }
    config = {"training": {"learning_rate": DECLARED, **declared}}
    tags = {**evidence.tags, "hyprun.knobs": json.dumps(knobs)}
    evidence = dataclasses.replace(evidence, config=config, tags=tags)
    return [f.id for f in triage(evidence).findings]


@pytest.mark.parametrize(
    "decay, warmup, declared, fired",
    [
        (0.0, True, {"weight_decay": 0.1, "warmup_steps": 4}, {"weight_decay_not_as_declared"}),
        (0.1, False, {"weight_decay": 0.1, "warmup_steps": 4}, {"warmup_not_as_declared"}),
        (0.1, True, {"weight_decay": 0.1, "warmup_steps": 4}, set()),
        (0.01, False, {}, set()),  # nothing declared: AdamW's own default decay, no warmup
    ],
)
def test_a_declared_decay_or_warmup_the_optimizer_never_got_is_a_finding(
    uri, decay, warmup, declared, fired
):
    found = set(settings_findings(uri, decay, warmup, declared))
    rows = {"weight_decay_not_as_declared", "warmup_not_as_declared"}
    assert found & rows == fired, found
