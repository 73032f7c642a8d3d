"""Two structure invariants read by the probe at the first steps (diag/invariants.py).

padding_idx_on_real_token: an embedding's padding_idx row gets no gradient, so the id it names
must be padding only. A Llama whose pad token is its end-of-text (a common recipe when a
tokenizer has no pad token) freezes the end-of-text embedding, which every document attends
to; with a pad token of its own it passes. layer_weights_shared: the blocks of a stack are
distinct modules; `nn.ModuleList([block] * n)` makes one block run n times (one set of
weights), while n built blocks pass, and so does the HF GPT-2."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    DataCollatorForLanguageModeling,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from tests.helpers import probed_checks
from tests.test_masked_tokens import EOS, PAD, WORDS, documents, tokenizer

CHECKS = ("padding_idx_on_real_token", "layer_weights_shared")


def llama(pad_id: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(WORDS),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        pad_token_id=pad_id,
        eos_token_id=EOS,
    )
    return LlamaForCausalLM(config)


def collated_statuses(pad: str) -> dict[str, str]:
    """The checks on a Llama whose embedding pads with `pad`, trained from the collator."""
    collate = DataCollatorForLanguageModeling(tokenizer(pad), mlm=False)
    model = llama(EOS if pad == "<eos>" else PAD)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [collate(documents(step)) for step in range(5)]
    checks = probed_checks(model, optimizer, lambda net, b: net(**b).loss, batches[:4], batches[4])
    return {check: checks[check]["status"] for check in CHECKS}


@pytest.mark.parametrize("pad, status", [("<eos>", "fail"), ("<pad>", "pass")])
def test_a_pad_id_that_is_the_end_of_text_freezes_a_real_token(uri, pad, status):
    found = collated_statuses(pad)
    assert found == {"padding_idx_on_real_token": status, "layer_weights_shared": "pass"}


class Stack(nn.Module):
    """Embedding, a ModuleList of feed-forward blocks, a head; `shared`: one block n times."""

    def __init__(self, shared: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(len(WORDS), 16)

        def block() -> nn.Module:
            return nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU())

        one = block()
        self.blocks = nn.ModuleList([one] * 3 if shared else [block() for _ in range(3)])
        self.head = nn.Linear(16, len(WORDS))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.blocks:
            h = h + layer(h)
        return self.head(h)


def stack_statuses(model: nn.Module) -> dict[str, str]:
    def loss_of(net, batch: torch.Tensor) -> torch.Tensor:
        logits = net(batch[:, :-1])
        logits = logits if torch.is_tensor(logits) else logits.logits
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [
        torch.randint(2, len(WORDS), (4, 13), generator=torch.Generator().manual_seed(step))
        for step in range(5)
    ]
    checks = probed_checks(model, optimizer, loss_of, batches[:4], batches[4])
    return {check: checks[check]["status"] for check in CHECKS}


def test_one_block_appended_n_times_fails_and_n_built_blocks_pass(uri):
    assert stack_statuses(Stack(shared=True))["layer_weights_shared"] == "fail"
    assert stack_statuses(Stack(shared=False))["layer_weights_shared"] == "pass"
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=len(WORDS)))
    assert set(stack_statuses(gpt2).values()) <= {"pass", "skip"}
