"""Modules the forward runs that the model does not hold (diag/invariants.py
modules_unregistered).

Layers kept in a plain Python list are not submodules: model.parameters() misses them, the
optimizer never gets them, and they stay at init (pytorch/pytorch#59925's form). Held in an
nn.ModuleList they train. A module outside the model that trains by another optimizer (a GAN's
discriminator run in the generator's loss) moves, and one frozen on purpose (a fixed feature
extractor) has no trainable weights: both pass. Through the probe of a plain loop, and the HF
GPT-2."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from hyprun.diag.evidence import Evidence
from hyprun.diag.live_checks import LiveFacts, live_checks
from hyprun.diag.triage import triage
from hyprun.runner.job.probe import Probe
from tests.helpers import probe_checks

VOCAB, WIDTH, SEQ, STEPS = 32, 16, 8, 4
CHECK = "modules_not_registered"


class Net(nn.Module):
    """An embedding, two hidden layers, a head; `held` is how the hidden layers are kept."""

    def __init__(self, held: str = "module_list", outside: nn.Module | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB)
        layers = [nn.Linear(WIDTH, WIDTH) for _ in range(2)]
        self.layers = nn.ModuleList(layers) if held == "module_list" else layers
        self.outside = [outside] if outside is not None else []  # not a submodule, on purpose

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = h + torch.tanh(layer(h))
        for module in self.outside:
            h = h + module(h)
        return self.head(h)


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model: nn.Module, pair) -> torch.Tensor:
    x, y = pair
    logits = model(x) if not isinstance(model, GPT2LMHeadModel) else model(input_ids=x).logits
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def check_of(model: nn.Module, other: nn.Module | None = None) -> dict:
    """The check on a probed AdamW loop over model.parameters(); `other`, if given, is stepped
    by an optimizer of its own after each step (a GAN's second network)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    own = torch.optim.AdamW(other.parameters(), lr=1e-3) if other is not None else None
    probe = Probe(
        model, optimizer, step_unit="steps", every_steps=2, heldout=batch(99), loss_fn=loss_of
    )
    for step in range(STEPS):
        loss = loss_of(model, batch(step))
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if own is not None:
            own.step()
            own.zero_grad()
    probe.close()
    return probe_checks(probe.run_id)[CHECK]


def test_layers_in_a_plain_list_fail_and_in_a_module_list_pass(uri):
    check = check_of(Net("plain_list"))
    assert check["status"] == "fail" and check["value"] == 2, check
    assert "Linear outside the model" in check["why"], check["why"]
    assert check_of(Net("module_list"))["status"] == "pass"


@pytest.mark.parametrize("kind", ["trained_by_its_own_optimizer", "frozen"])
def test_a_module_outside_the_model_that_trains_or_is_frozen_passes(uri, kind):
    torch.manual_seed(1)
    outside = nn.Linear(WIDTH, WIDTH)
    if kind == "frozen":
        outside.requires_grad_(False)
    other = outside if kind == "trained_by_its_own_optimizer" else None
    assert check_of(Net(outside=outside), other)["status"] == "pass"


def test_the_hf_gpt2_passes(uri):
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB))
    assert check_of(gpt2)["status"] == "pass"


def test_the_violation_is_the_finding_of_its_id():
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    facts.unregistered = {"a Linear outside the model (#1)": 2}
    checks = [check.__dict__ for check in live_checks(facts)]
    assert [f.id for f in triage(Evidence(static=checks)).findings] == [CHECK]
