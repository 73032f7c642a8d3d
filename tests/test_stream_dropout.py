"""Dropout on the residual stream itself (diag/invariants.py stream_dropped;
hyunwoongko/transformer#8).

`x = dropout(x + f(x))` zeroes a share of the stream at every layer; `x = x + dropout(f(x))`
leaves a zero only where every term of the sum was dropped at once. Read on the norm layers
after the first (the first reads the embedding, which GPT-2 drops on purpose), train mode over
eval mode. Through the probe of a plain loop both ways, and on Hugging Face's GPT-2 and BERT as
shipped (dropout 0.1 on the embeddings and every branch)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

from hyprun.diag.live_checks import LiveFacts
from tests.helpers import finding_ids, probed_check

VOCAB, SEQ, WIDTH = 32, 8, 16
CHECK = "dropout_on_residual_stream"


class Block(nn.Module):
    """A pre-norm residual MLP block with dropout 0.1, on its branch or (`on_stream`) on the
    sum."""

    def __init__(self, on_stream: bool):
        super().__init__()
        self.on_stream = on_stream
        self.norm = nn.LayerNorm(WIDTH)
        wide = 2 * WIDTH
        self.mlp = nn.Sequential(nn.Linear(WIDTH, wide), nn.GELU(), nn.Linear(wide, WIDTH))
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.on_stream:
            return self.drop(x + self.mlp(self.norm(x)))
        return x + self.drop(self.mlp(self.norm(x)))


class Stack(nn.Module):
    def __init__(self, on_stream: bool):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(on_stream) for _ in range(2)])
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def loss_of(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    if isinstance(model, GPT2LMHeadModel | BertForMaskedLM):
        return model(input_ids=batch, labels=batch).loss
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def batch(seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def hugging_face_model(family: str, attention: str | None = None) -> nn.Module:
    """A 2-layer GPT-2 (`family` "gpt2"; `attention`: its kernel, default the library's) or BERT
    for masked LM, as shipped (dropout 0.1 everywhere), at this file's sizes."""
    if family == "gpt2":
        config = GPT2Config(n_layer=2, n_embd=WIDTH, n_head=2, vocab_size=VOCAB)
        if attention is not None:
            config._attn_implementation = attention
        return GPT2LMHeadModel(config)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
    )
    return BertForMaskedLM(config)


def check_of(model: nn.Module) -> dict:
    return probed_check(model, loss_of, batch, CHECK)


@pytest.mark.parametrize(("on_stream", "status"), [(True, "fail"), (False, "pass")])
def test_dropout_on_the_sum_fails_and_on_the_branch_passes(uri, on_stream, status):
    torch.manual_seed(0)
    check = check_of(Stack(on_stream))
    assert check["status"] == status, check


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_hugging_face_models_as_shipped_pass(uri, family):
    torch.manual_seed(0)
    assert check_of(hugging_face_model(family))["status"] == "pass"


def test_the_violation_is_the_finding_of_its_id():
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    facts.dropout_max = (0.1, ["blocks.0.drop"])
    facts.stream_zeros = {"blocks.1.norm": 0.1}
    assert finding_ids(facts) == [CHECK]
