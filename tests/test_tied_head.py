"""An output head declared tied to the token embedding that is a tensor of its own
(diag/invariants.py head_untied).

A Hugging Face model with tie_word_embeddings shares one tensor between its token embedding
and its head. A head replaced after init (or a resize, a load, a wrapper that copies one side)
breaks the tie silently: the head trains apart, or keeps a random init where a checkpoint stored
the shared tensor once. Through the probe of a plain loop on the HF GPT-2, bare and inside a
wrapper module (as a Lightning module holds it); a model that declares no tie is not judged."""

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

VOCAB, SEQ = 32, 8
CHECK = "tied_head_untied"


class Wrapper(nn.Module):
    """A module holding the HF model, as a LightningModule does."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits


def gpt2(tie: bool = True) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, tie_word_embeddings=tie)
    return GPT2LMHeadModel(config)


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model: nn.Module, pair) -> torch.Tensor:
    x, y = pair
    logits = model(input_ids=x).logits if isinstance(model, GPT2LMHeadModel) else model(x)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def check_of(model: nn.Module) -> dict:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [batch(seed) for seed in range(4)]
    return probed_checks(model, optimizer, loss_of, batches, batch(99))[CHECK]


def untied(model: GPT2LMHeadModel) -> GPT2LMHeadModel:
    """The head replaced by a copy of itself after init: the config still says tied."""
    model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
    return model


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_broken_tie_fails_and_the_tie_in_effect_passes(uri, wrapped):
    def build(model):
        return Wrapper(model) if wrapped else model

    assert check_of(build(gpt2()))["status"] == "pass"
    check = check_of(build(untied(gpt2())))
    assert check["status"] == "fail", check
    assert "tie_word_embeddings" in check["why"]


def test_a_model_that_declares_no_tie_is_not_judged(uri):
    assert check_of(gpt2(tie=False))["status"] == "skip"


def test_the_violation_is_the_finding_of_its_id():
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    facts.untied_heads = ["the model"]
    checks = [check.__dict__ for check in live_checks(facts)]
    assert [f.id for f in triage(Evidence(static=checks)).findings] == [CHECK]
