"""Attention scaled and normalised (runner/job/attention_reads.py; diag/invariants.py
attention_scale_wrong, attention_rows_unnormalised).

q.k must reach the softmax divided by sqrt(head_dim), and the weights that mix the values must
sum to one over the keys. Read on one eval forward, whatever wrote the attention: torch's SDPA,
an attention written by hand (scaled after the product, or q scaled before it, as timm does),
Hugging Face's GPT-2, Llama and T5 (unscaled by design, its q's init scaled down instead)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, T5Config, T5ForConditionalGeneration

from hyprun.diag.invariants import attention_rows_unnormalised, attention_scale_wrong
from hyprun.diag.live_checks import LiveFacts
from hyprun.runner.job.attention_reads import attention_reads
from tests.helpers import finding_ids, probed_checks

VOCAB, SEQ, WIDTH, HEADS = 40, 12, 32, 2
CHECKS = ("attention_scale_wrong", "attention_rows_unnormalised")
HEALTHY = ("sdpa", "scaled_after", "q_scaled_before")
"""Attentions written right: both checks pass."""
FAULTS = {
    "sdpa_unscaled": "attention_scale_wrong",
    "unscaled": "attention_scale_wrong",
    "scale_inverted": "attention_scale_wrong",
    "mask_after_softmax": "attention_rows_unnormalised",
    "softmax_over_queries": "attention_rows_unnormalised",
}
"""Attentions written wrong, each with the check that names it."""


class TinyAttention(nn.Module):
    """One causal self-attention over token embeddings, written the way `style` says."""

    def __init__(self, style: str):
        super().__init__()
        self.style = style
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        rows, positions, width = x.shape
        head_dim = width // HEADS
        q, k, v = (
            z.view(rows, positions, HEADS, head_dim).transpose(1, 2)
            for z in self.qkv(x).chunk(3, dim=-1)
        )
        out = self.attend(q, k, v, head_dim, torch.ones(positions, positions).tril().bool())
        return self.head(out.transpose(1, 2).reshape(rows, positions, width))

    def attend(self, q, k, v, head_dim: int, allowed: torch.Tensor) -> torch.Tensor:
        style = self.style
        if style in ("sdpa", "sdpa_unscaled"):
            scale = 1.0 if style == "sdpa_unscaled" else None
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        if style == "q_scaled_before":  # timm's Attention
            q = q * head_dim**-0.5
            scores = q @ k.transpose(-2, -1)
        elif style == "unscaled":
            scores = torch.matmul(q, k.transpose(-2, -1))
        elif style == "scale_inverted":  # scale = head_dim ** -0.5, then divided by it
            scores = (q @ k.transpose(-2, -1)) / head_dim**-0.5
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
        if style == "mask_after_softmax":
            return scores.softmax(dim=-1).masked_fill(~allowed, 0.0) @ v
        scores = scores.masked_fill(~allowed, float("-inf"))
        weights = scores.softmax(dim=-2 if style == "softmax_over_queries" else -1)
        return F.dropout(weights, 0.1, self.training) @ v


def ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def reads_of(model: nn.Module, forward):
    model.eval()
    with torch.no_grad():
        return attention_reads(model, forward)


def statuses(reads) -> dict[str, bool]:
    """By check: whether it is violated."""
    scale = attention_scale_wrong(reads.scales)
    rows = attention_rows_unnormalised(reads.unnormalised)
    return dict(zip(CHECKS, (bool(scale), bool(rows)), strict=True))


@pytest.mark.parametrize("style", HEALTHY + tuple(FAULTS))
def test_each_written_attention_reads_as_it_was_written(style):
    torch.manual_seed(0)
    model = TinyAttention(style)
    reads = reads_of(model, lambda: model(ids()[:, :-1]))
    violated = {check for check, broken in statuses(reads).items() if broken}
    assert violated == ({FAULTS[style]} if style in FAULTS else set()), reads


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_hugging_face_attentions_read_as_scaled_and_normalised(implementation):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB)
    config._attn_implementation = implementation
    model = GPT2LMHeadModel(config)
    reads = reads_of(model, lambda: model(input_ids=ids()).logits)
    assert len(reads.scales) == 2 and not any(statuses(reads).values()), reads


def test_t5_unscaled_by_design_reads_as_scaled():
    """T5 leaves q.k unscaled and scales q's init down by sqrt(head_dim) instead."""
    torch.manual_seed(0)
    config = T5Config(
        num_layers=1, d_model=WIDTH, d_kv=16, d_ff=64, num_heads=HEADS, vocab_size=VOCAB
    )
    config.decoder_start_token_id = config.pad_token_id = 0
    model = T5ForConditionalGeneration(config)
    reads = reads_of(model, lambda: model(input_ids=ids(), labels=ids(1)).logits)
    assert reads.scales and max(reads.scales) < 1.5, reads


def test_multihead_attention_is_not_read():
    """nn.MultiheadAttention's forward is one call to the reader: skipped, never judged."""
    attention = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
    x = torch.randn(2, SEQ, WIDTH)
    assert reads_of(attention, lambda: attention(x, x, x, need_weights=False)) is None


def loss_of(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


@pytest.mark.parametrize("style", ["sdpa", "scale_inverted", "mask_after_softmax"])
def test_the_probe_of_a_plain_loop_records_them(uri, style):
    torch.manual_seed(0)
    model = TinyAttention(style)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checks = probed_checks(model, optimizer, loss_of, [ids(s) for s in range(4)], ids(99))
    found = {check: checks[check]["status"] for check in CHECKS}
    expected = dict.fromkeys(CHECKS, "pass")
    if style in FAULTS:
        expected[FAULTS[style]] = "fail"
    assert found == expected, {check: checks[check]["why"] for check in found}


@pytest.mark.parametrize(
    ("fact", "value", "check"),
    [
        ("attention_scales", [1.0, 5.6], "attention_scale_wrong"),
        ("attention_rows", [0.0, 0.94], "attention_rows_unnormalised"),
    ],
)
def test_the_violation_is_the_finding_of_its_id(fact, value, check):
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    setattr(facts, fact, value)
    assert finding_ids(facts) == [check]
