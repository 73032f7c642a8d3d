"""A real token the loss masks at every occurrence (diag/invariants.py token_never_taught).

Through the probe of real loops: transformers' own DataCollatorForLanguageModeling with pad =
eos, which masks every label equal to the pad id, so the end-of-text token each row ends with
is never a target (torchtune#949 and the collator's many reports); the same collator with a pad
token of its own; a plain loop that masks one id of packed text, with no attention mask (the
loop names its pad id); and a prompt masked on purpose, as supervised fine-tuning does, which
masks spans of many ids and is no bug."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import (
    DataCollatorForLanguageModeling,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
)

from hyprun.diag.evidence import Evidence
from hyprun.diag.triage import triage
from tests.helpers import probed_checks

CHECK = "real_token_masked_as_padding"
WORDS = ["<eos>", "<pad>", *(f"w{i}" for i in range(30))]
EOS, PAD, ROWS, WIDTH = 0, 1, 6, 12


def tokenizer(pad: str) -> PreTrainedTokenizerFast:
    """A word-level tokenizer built here (nothing downloaded), padding with `pad`."""
    vocab = {word: i for i, word in enumerate(WORDS)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<eos>")),
        eos_token="<eos>",
        pad_token=pad,
    )


def documents(seed: int) -> list[dict[str, list[int]]]:
    """Rows of different lengths, each ending with its end-of-text token."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, WIDTH, (ROWS,), generator=generator)
    return [
        {"input_ids": [*torch.randint(2, len(WORDS), (int(n),), generator=generator).tolist(), EOS]}
        for n in lengths
    ]


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(WORDS)))


def collated_status(pad: str) -> str:
    """The check's status on a GPT-2 trained from the collator's batches (pad = `pad`)."""
    collate = DataCollatorForLanguageModeling(tokenizer(pad), mlm=False)
    model = gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [collate(documents(step)) for step in range(5)]
    checks = probed_checks(model, optimizer, lambda net, b: net(**b).loss, batches[:4], batches[4])
    return checks[CHECK]["status"]


@pytest.mark.parametrize("pad, status", [("<eos>", "fail"), ("<pad>", "pass")])
def test_the_collator_with_pad_eos_never_teaches_the_end_of_text(uri, pad, status):
    assert collated_status(pad) == status


def packed(step: int, masked: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed rows, each document closed by its end-of-text, and their next-token targets
    masked one way: `eos` every end-of-text, `prompt` each row's first half."""
    generator = torch.Generator().manual_seed(step)
    ids = torch.randint(2, len(WORDS), (ROWS, WIDTH + 1), generator=generator)
    ids[:, 3::4] = EOS
    inputs, target = ids[:, :-1], ids[:, 1:].clone()
    if masked == "eos":  # labels[labels == pad_id] = -100, with pad = eos
        target[target == EOS] = -100
    else:  # the prompt masked, as fine-tuning does
        target[:, : WIDTH // 2] = -100
    return inputs, target


def loop_status(masked: str) -> str:
    """A plain loop over packed rows: no attention mask, the loop names its pad id."""

    def loss_of(net, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, target = batch
        return F.cross_entropy(net(input_ids=inputs).logits.flatten(0, 1), target.flatten())

    model = gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [packed(step, masked) for step in range(5)]
    checks = probed_checks(model, optimizer, loss_of, batches[:4], batches[4], pad_id=PAD)
    return checks[CHECK]["status"]


@pytest.mark.parametrize("masked, status", [("eos", "fail"), ("prompt", "pass")])
def test_a_loop_masking_one_id_fails_and_a_masked_prompt_passes(uri, masked, status):
    assert loop_status(masked) == status


def test_the_failed_check_is_the_finding_named_by_the_corpus_cause_id():
    static = [{"id": CHECK, "status": "fail", "value": 1, "why": "", "question": "Q1"}]
    assert triage(Evidence(static=static)).findings[0].id == CHECK
