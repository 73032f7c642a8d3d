"""Dropout calls that do not drop what the model goes on with (diag/invariants.py
dropout_misapplied; runner/job/dropout_calls.py).

A dropout whose result is never assigned (evintunador/templateGPT#1) leaves its tensor
undropped; the same dropout written twice (TimDettmers/ConvE#19) drops at 1 - (1 - p)^2. Both
are read from one training forward's calls and the loss's gradient graph. Through the probe of
a plain loop each way, and on Hugging Face's GPT-2 (both attention kernels) and BERT as
shipped, whose every dropout call feeds the loss once. And a rate never passed on
(huawei-noah/multi_hyp_cc PR 17: nn.Dropout() at torch's 0.5), held against the rate the app
declares through its model.dropout knob (diag/features.py dropout_over_declared)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyprun.diag.live_checks import LiveFacts
from hyprun.diag.triage import triage
from hyprun.runner.control.diagnose import read_evidence
from hyprun.runner.job.dropout_calls import dropout_calls
from tests.helpers import finding_ids, probed_check, probed_run
from tests.test_stream_dropout import VOCAB, WIDTH, batch, hugging_face_model, loss_of

CHECK = "dropout_not_as_declared"


class Net(nn.Module):
    """Embedding dropout, then a residual MLP whose output is dropped functionally: correct,
    the embedding's dropout written twice (`twice`), or the MLP's dropout not assigned
    (`unassigned`)."""

    def __init__(self, bug: str = ""):
        super().__init__()
        self.bug = bug
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.drop = nn.Dropout(0.1)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH)
        )
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.embed(ids))
        if self.bug == "twice":
            x = self.drop(x)
        dx = self.mlp(x)
        if self.bug == "unassigned":
            F.dropout(dx, 0.1, training=self.training)
        else:
            dx = F.dropout(dx, 0.1, training=self.training)
        return self.head(x + dx)


@pytest.mark.parametrize(
    ("bug", "discarded", "stacked"),
    [("", [], []), ("twice", [], ["drop"]), ("unassigned", ["Net"], [])],
)
def test_the_calls_read_each_way(bug, discarded, stacked):
    torch.manual_seed(0)
    model = Net(bug)
    calls = dropout_calls(model, lambda: loss_of(model, batch(0)))
    assert (calls.applied, calls.discarded, calls.stacked) == (
        3 if bug == "twice" else 2,
        discarded,
        stacked,
    )


def test_the_read_leaves_training_as_it_was():
    """The read draws its masks in a forked RNG and writes no gradient."""
    torch.manual_seed(0)
    model = Net().eval()
    before = torch.random.get_rng_state()
    dropout_calls(model, lambda: loss_of(model, batch(0)))
    assert torch.equal(torch.random.get_rng_state(), before)
    assert not model.training
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(
    ("bug", "status"), [("", "pass"), ("twice", "fail"), ("unassigned", "fail")]
)
def test_through_the_probe(uri, bug, status):
    torch.manual_seed(0)
    check = probed_check(Net(bug), loss_of, batch, CHECK)
    assert check["status"] == status, check


@pytest.mark.parametrize("family", ["gpt2-sdpa", "gpt2-eager", "bert"])
def test_hugging_face_models_as_shipped_pass(uri, family):
    torch.manual_seed(0)
    name, _, attention = family.partition("-")
    check = probed_check(hugging_face_model(name, attention or None), loss_of, batch, CHECK)
    assert check["status"] == "pass", check
    assert check["value"] == 0


def test_a_model_without_dropout_is_not_judged(uri):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB))
    assert probed_check(model, loss_of, batch, CHECK)["status"] == "skip"


def test_the_violation_is_the_finding_of_its_id():
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    facts.dropout_calls = (4, ["blocks.0"], [])
    assert finding_ids(facts) == [CHECK]


def declared_findings(uri: str, built: nn.Dropout, knobs: dict) -> list[str]:
    """Findings of a probed loop over Net whose embedding dropout is `built`, its app declaring
    a rate of 0.1 in its own key through `knobs`."""
    torch.manual_seed(0)
    model = Net()
    model.drop = built
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [batch(seed) for seed in range(4)]
    evidence, _ = read_evidence(uri, probed_run(model, optimizer, loss_of, batches, batch(99)))
    tags = {**evidence.tags, "hyprun.knobs": json.dumps(knobs)}
    config = {"net": {"dropout": 0.1}}
    return [f.id for f in triage(dataclasses.replace(evidence, config=config, tags=tags)).findings]


KNOB = {"model.dropout": {"key": "net.dropout"}}


@pytest.mark.parametrize(
    ("built", "knobs", "fires"),
    [
        (nn.Dropout(), KNOB, True),  # the configured rate never passed: torch's 0.5
        (nn.Dropout(0.1), KNOB, False),
        (nn.Dropout(), {}, False),  # no rate declared: nothing to hold it against
    ],
)
def test_a_rate_other_than_the_declared_one_is_a_finding(uri, built, knobs, fires):
    found = declared_findings(uri, built, knobs)
    assert (CHECK in found) == fires, found
