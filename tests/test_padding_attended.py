"""Real positions whose outputs move when only the padding does (diag/invariants.py
padding_read).

torch's key_padding_mask is True at pads; Hugging Face's attention_mask is 1 at real tokens.
Handed one for the other, the encoder attends to its padding and ignores its text. Left padding
with no mask makes a causal model read its pads too. Through the probe of a plain loop: a
bidirectional encoder given its mask right and inverted (padding read from Probe(pad_id=)), and
Hugging Face's GPT-2 left-padded with and without its attention_mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from hyprun.diag.live_checks import LiveFacts
from tests.helpers import finding_ids, probed_checks

VOCAB, SEQ, WIDTH, PAD = 32, 10, 16, 0
CHECK = "padding_attended"


class Encoder(nn.Module):
    """A bidirectional encoder layer that builds its key_padding_mask from the ids, right
    (True at pads) or `inverted` (True at real tokens, Hugging Face's convention)."""

    def __init__(self, inverted: bool):
        super().__init__()
        self.inverted = inverted
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layer = nn.TransformerEncoderLayer(WIDTH, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pads = ids == PAD
        return self.head(
            self.layer(self.embed(ids), src_key_padding_mask=~pads if self.inverted else pads)
        )


def padded_rows(seed: int, left: bool = False) -> torch.Tensor:
    """Rows of real ids (never PAD) padded with PAD to SEQ + 1, at the end or (`left`) start."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(1, VOCAB, (4, SEQ + 1), generator=generator)
    for row, length in enumerate((SEQ + 1, SEQ - 2, SEQ - 4, SEQ - 1)):
        if left:
            rows[row, : SEQ + 1 - length] = PAD
        else:
            rows[row, length:] = PAD
    return rows


def encoder_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), ignore_index=PAD)


@pytest.mark.parametrize(("inverted", "status"), [(True, "fail"), (False, "pass")])
def test_a_padding_mask_in_the_other_convention_fails(uri, inverted, status):
    torch.manual_seed(0)
    model = Encoder(inverted)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [padded_rows(seed) for seed in range(4)]
    checks = probed_checks(model, optimizer, encoder_loss, batches, padded_rows(99), pad_id=PAD)
    assert checks[CHECK]["status"] == status, checks[CHECK]


def hf_batch(seed: int, masked: bool) -> dict[str, torch.Tensor]:
    ids = padded_rows(seed, left=True)
    batch = {"input_ids": ids, "labels": ids.masked_fill(ids == PAD, -100)}
    return {**batch, "attention_mask": (ids != PAD).long()} if masked else batch


def hf_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    return model(**batch).loss


@pytest.mark.parametrize(("masked", "status"), [(False, "fail"), (True, "pass")])
def test_left_padding_without_its_mask_fails(uri, masked, status):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=WIDTH, n_head=2, vocab_size=VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [hf_batch(seed, masked) for seed in range(4)]
    heldout = hf_batch(99, masked)
    checks = probed_checks(model, optimizer, hf_loss, batches, heldout, pad_id=PAD)
    assert checks[CHECK]["status"] == status, checks[CHECK]


def test_the_violation_is_the_finding_of_its_id():
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    facts.padding_influence = 0.4
    assert finding_ids(facts) == [CHECK]
