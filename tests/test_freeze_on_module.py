"""A freeze written on a module instead of its parameters (diag/invariants.py
freeze_on_module_ignored).

`model.embed.requires_grad = False` sets an attribute torch never reads: the embedding trains
(a PyTorch-forum classic; transformers' own unispeech_sat sets it on layer_norm_for_extract).
`requires_grad_(False)` freezes it. Through the probe of a plain loop and the HF GPT-2, and on
a real Lightning fit whose module sets the attribute."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from hyprun.diag.evidence import Evidence
from hyprun.diag.live_checks import LiveFacts, live_checks
from hyprun.diag.triage import triage
from tests.helpers import probed_checks

VOCAB, WIDTH, SEQ = 32, 16, 8
CHECK = "freeze_set_on_module"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(ids)))


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model: nn.Module, pair) -> torch.Tensor:
    x, y = pair
    logits = model(x) if not isinstance(model, GPT2LMHeadModel) else model(input_ids=x).logits
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def check_of(model: nn.Module) -> dict:
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    batches = [batch(seed) for seed in range(4)]
    return probed_checks(model, optimizer, loss_of, batches, batch(99))[CHECK]


@pytest.mark.parametrize("freeze", ["attribute", "method", "none", "attribute_and_method"])
def test_only_a_freeze_that_left_its_parameters_training_fails(uri, freeze):
    model = Net()
    if freeze.startswith("attribute"):
        model.embed.requires_grad = False  # the bug: an attribute torch ignores
    if freeze.endswith("method"):
        model.embed.requires_grad_(False)
    check = check_of(model)
    assert check["status"] == ("fail" if freeze == "attribute" else "pass"), check
    if freeze == "attribute":
        assert "embed" in check["why"] and "1 of its parameters still train" in check["why"]


def test_the_hf_gpt2_passes(uri):
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB))
    assert check_of(gpt2)["status"] == "pass"


def test_the_violation_is_the_finding_of_its_id():
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    facts.freeze_ignored = {"encoder": 12}
    checks = [check.__dict__ for check in live_checks(facts)]
    findings = triage(Evidence(static=checks)).findings
    assert [finding.id for finding in findings] == [CHECK]
    assert not findings[0].cards  # a code fix: no config knob tests it
