"""A row's output that moves with its place in the batch (diag/invariants.py batch_index_read).

The PyTorch tutorial's PositionalEncoding is written for sequence-first tensors
(`x + pe[:x.size(0)]`); fed batch-first ones it adds row b's encoding at every position of row
b: word order is lost and each row is read by its index. In eval mode a row's output is a
function of that row alone, wherever it sits in the batch. Through the probe of a plain loop on
the tutorial's encoding both ways, and on Hugging Face's GPT-2."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from hyprun.diag.live_checks import LiveFacts
from tests.helpers import finding_ids, probed_check

VOCAB, SEQ, WIDTH = 32, 8, 16
CHECK = "batch_index_encoded"


class PositionalEncoding(nn.Module):
    """The tutorial's sinusoidal encoding, its table laid out (max_len, 1, width)."""

    def __init__(self, max_len: int = 64):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        rate = torch.exp(torch.arange(0, WIDTH, 2) * (-math.log(10000.0) / WIDTH))
        table = torch.zeros(max_len, 1, WIDTH)
        table[:, 0, 0::2] = torch.sin(position * rate)
        table[:, 0, 1::2] = torch.cos(position * rate)
        self.register_buffer("pe", table)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pe[: x.size(0)]  # sequence-first: x is (positions, rows, width)


class Encoder(nn.Module):
    """Embedding, the tutorial's encoding, a causal encoder layer and a head, batch-first;
    `sequence_first` feeds the encoding the layout it was written for."""

    def __init__(self, sequence_first: bool):
        super().__init__()
        self.sequence_first = sequence_first
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = PositionalEncoding()
        self.layer = nn.TransformerEncoderLayer(WIDTH, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        if self.sequence_first:
            x = self.position(x.transpose(0, 1)).transpose(0, 1)
        else:
            x = self.position(x)  # batch-first tensors into a sequence-first encoding
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.head(self.layer(x, src_mask=mask, is_causal=True))


def loss_of(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    inputs = batch[:, :-1]
    logits = model(input_ids=inputs).logits if isinstance(model, GPT2LMHeadModel) else model(inputs)
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def batch(seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def check_of(model: nn.Module) -> dict:
    return probed_check(model, loss_of, batch, CHECK)


@pytest.mark.parametrize(("sequence_first", "status"), [(False, "fail"), (True, "pass")])
def test_an_encoding_indexed_by_row_fails(uri, sequence_first, status):
    torch.manual_seed(0)
    check = check_of(Encoder(sequence_first))
    assert check["status"] == status, check


def test_hugging_face_gpt2_reads_each_row_alone(uri):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=WIDTH, n_head=2, vocab_size=VOCAB))
    assert check_of(model)["status"] == "pass"


def test_the_violation_is_the_finding_of_its_id():
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    facts.index_influence = 0.3
    assert finding_ids(facts) == [CHECK]
