"""A next-token loss that reads the model's logits rescaled (diag/invariants.py
logits_rescaled; model_checks.loss_logit_scale).

GMISWE/tinker-cloud PR 26: the training loss divided the logits by the sampling temperature,
so the model learned logits 0.7x too small and every reader of them as returned saw a flatter
distribution. Read as the factor between the cross-entropy's input and the model's logits in
one forward, exact to float32 rounding. Through the probe: a plain loop with and without the
temperature, one that shifts the logits rather than the labels, Hugging Face's GPT-2 as
shipped, and a contrastive-style loss on targets that are not the next token (not judged)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from hyprun.diag.live_checks import LiveFacts
from tests.helpers import finding_ids, probed_check

VOCAB, SEQ, WIDTH = 32, 8, 16
CHECK = "loss_reads_scaled_logits"


def language_model() -> nn.Module:
    return nn.Sequential(
        nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, VOCAB)
    )


def batch(seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def next_token_loss(temperature: float = 1.0, shift_logits: bool = False):
    def loss_of(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        if isinstance(model, GPT2LMHeadModel):
            return model(input_ids=ids, labels=ids).loss
        # shift_logits: the whole row in, the last position's logits dropped
        logits = model(ids)[:, :-1] if shift_logits else model(ids[:, :-1])
        return F.cross_entropy((logits / temperature).flatten(0, 1), ids[:, 1:].flatten())

    return loss_of


@pytest.mark.parametrize(
    ("temperature", "shift_logits", "status"),
    [(1.0, False, "pass"), (0.7, False, "fail"), (1.0, True, "pass"), (2.0, True, "fail")],
)
def test_through_the_probe(uri, temperature, shift_logits, status):
    torch.manual_seed(0)
    check = probed_check(language_model(), next_token_loss(temperature, shift_logits), batch, CHECK)
    assert check["status"] == status, check
    assert check["value"] == pytest.approx(1 / temperature, rel=1e-3)


def test_hugging_face_gpt2_as_shipped_passes(uri):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=WIDTH, n_head=2, vocab_size=VOCAB))
    assert probed_check(model, next_token_loss(), batch, CHECK)["status"] == "pass"


def test_targets_that_are_not_the_next_token_are_not_judged(uri):
    """A temperature in a loss whose targets are not the next token (a contrastive or a
    classifier loss) is that loss's design."""
    torch.manual_seed(0)

    def loss_of(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        logits = model(ids[:, :-1]) / 0.07
        return F.cross_entropy(logits.flatten(0, 1), (ids[:, :-1] * 7 % VOCAB).flatten())

    assert probed_check(language_model(), loss_of, batch, CHECK)["status"] == "skip"


def test_the_violation_is_the_finding_of_its_id():
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    facts.label_reads = [(0.0, 1.0, 0.0)]
    facts.loss_logit_scale = 1.43
    assert finding_ids(facts) == [CHECK]
