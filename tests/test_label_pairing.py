"""Training labels are paired with their inputs (runner/job/model_checks.heldout_label_offsets,
diag/invariants.py labels_unpaired): where the held-out batch's targets are its next tokens,
the training targets must match their inputs at some offset. Through the probe of a real loop:
labels shuffled apart from their rows (mlcommons/GaNDLF PR 870), a healthy language model, a
Hugging Face GPT-2 that shifts its labels itself, and a classifier (not judged); then into the
finding named by the corpus cause id."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from hyprun.diag.evidence import Evidence
from hyprun.diag.triage import triage
from hyprun.runner.job.probe import Probe
from tests.helpers import probe_checks

VOCAB, WIDTH, ROWS = 32, 12, 8


def rows(seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (ROWS, WIDTH + 1), generator=torch.Generator().manual_seed(seed))


def next_tokens(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return tokens[:, :-1], tokens[:, 1:]


def probed(kind: str) -> dict:
    torch.manual_seed(0)
    if kind == "hf":
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB))
    else:
        model = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_of(net: nn.Module, batch) -> torch.Tensor:
        if kind == "hf":
            return net(input_ids=batch, labels=batch).loss
        x, y = batch
        if kind == "classifier":  # one label per row
            return F.cross_entropy(net(x).mean(1), y)
        return F.cross_entropy(net(x).flatten(0, 1), y.flatten())

    def batch_of(seed: int):
        tokens = rows(seed)
        if kind == "hf":
            return tokens
        x, y = next_tokens(tokens)
        if kind == "classifier":
            return x, y[:, 0] % 4
        if kind == "shuffled":  # labels drawn in another order than their inputs
            y = y[torch.randperm(ROWS, generator=torch.Generator().manual_seed(seed + 1))]
        return x, y

    heldout = rows(99) if kind == "hf" else batch_of(99)
    if kind == "shuffled":
        heldout = next_tokens(rows(99))  # the evaluation set is built right
    probe = Probe(
        model, optimizer, step_unit="steps", every_steps=2, heldout=heldout, loss_fn=loss_of
    )
    for step in range(4):
        loss = loss_of(model, batch_of(step))
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    probe.close()
    return probe_checks(probe.run_id)["labels_shuffled_apart"]


@pytest.mark.parametrize(
    "kind, status",
    [("healthy", "pass"), ("hf", "pass"), ("classifier", "skip"), ("shuffled", "fail")],
)
def test_only_labels_taken_from_other_rows_fail(uri, kind, status):
    check = probed(kind)
    assert check["status"] == status, check
    if status == "fail":
        finding = triage(Evidence(static=[check])).findings[0]
        assert finding.id == "labels_shuffled_apart" and finding.cards == []
