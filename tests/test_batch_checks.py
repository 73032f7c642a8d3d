"""Rows of a batch stay apart and the training ids span the held-out ones (runner/job/
model_checks.row_influence, diag/invariants.py rows_mixed and ids_beyond_training). Through the
probe of a real loop: batch-first tensors fed to a sequence-first encoder (Exorust/TorchLeet#5)
and ids written in a dtype narrower than the vocabulary (huggingface/transformers#2825), each
beside its healthy twin and a Hugging Face GPT-2; then into the finding named by the corpus
cause id."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from hyprun.diag.evidence import Evidence
from hyprun.diag.triage import triage
from tests.helpers import probed_checks

VOCAB, WIDTH, ROWS, WRAP = 64, 12, 6, 40
CHECKS = ("batch_first_mismatch", "token_ids_overflow")


class Encoder(nn.Module):
    """Embeddings into a causal nn.TransformerEncoder, batch-first or (the bug) not."""

    def __init__(self, batch_first: bool):
        super().__init__()
        torch.manual_seed(0)
        self.batch_first = batch_first
        self.embed = nn.Embedding(VOCAB, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, 0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)  # (batch, seq, feature) either way, as the loop hands it
        mask = nn.Transformer.generate_square_subsequent_mask(h.shape[1 if self.batch_first else 0])
        return self.head(self.encoder(h, mask=mask, is_causal=True))


def probed(kind: str) -> dict[str, str]:
    model = (
        GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB))
        if kind == "hf"
        else Encoder(batch_first=kind != "seq_first")
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_of(net: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        if kind == "hf":
            return net(input_ids=tokens, labels=tokens).loss
        return F.cross_entropy(net(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())

    def rows(seed: int) -> torch.Tensor:
        drawn = torch.randint(VOCAB, (ROWS, WIDTH), generator=torch.Generator().manual_seed(seed))
        return drawn % WRAP if kind == "wrapped" and seed < 99 else drawn  # training ids only

    checks = probed_checks(model, optimizer, loss_of, [rows(s) for s in range(4)], rows(99))
    return {check: checks[check]["status"] for check in CHECKS}


@pytest.mark.parametrize(
    "kind, failed",
    [("healthy", None), ("hf", None), ("seq_first", "batch_first_mismatch")]
    + [("wrapped", "token_ids_overflow")],
)
def test_each_bug_fails_its_own_check_and_only_it(uri, kind, failed):
    found = probed(kind)
    assert {check for check, status in found.items() if status == "fail"} == (
        {failed} if failed else set()
    ), found
    assert set(found.values()) <= {"pass", "fail"}, found  # judged on every model here


def test_a_failed_check_is_the_finding_named_by_the_corpus_cause_id():
    for check in CHECKS:
        static = [{"id": check, "status": "fail", "value": 0.3, "why": "", "question": "Q1"}]
        assert triage(Evidence(static=static)).findings[0].id == check
