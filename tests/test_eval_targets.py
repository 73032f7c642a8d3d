"""An evaluation whose loss counts targets the training loss never does (diag/invariants.py
eval_targets_untrained; runner/job/eval_targets.py).

A held-out mask taken from the inputs' padding mask instead of the shifted labels'
(SkyworkAI/Skywork#55) scores the pad after each row's last real token, which training masks.
Through the probe of a plain loop on right-padded rows, its evaluation masked so and as
training is; and Hugging Face's GPT-2 trained and evaluated on the same labels (its own loss)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyprun.diag.live_checks import LiveFacts
from tests.helpers import finding_ids, probe_checks, probed_run
from tests.test_stream_dropout import VOCAB, WIDTH, hugging_face_model

CHECK = "eval_counts_untrained_targets"
PAD, IGNORE, ROWS, SEQ = 0, -100, 16, 12


def padded(seed: int) -> torch.Tensor:
    """ROWS rows of real ids (1..VOCAB-1) of 4 to SEQ tokens, right-padded with PAD."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (ROWS, SEQ), generator=generator)
    lengths = torch.randint(4, SEQ, (ROWS, 1), generator=generator)
    return torch.where(torch.arange(SEQ) < lengths, ids, PAD)


def labels(ids: torch.Tensor, mask_from_inputs: bool = False) -> torch.Tensor:
    """The next token at each position, padded labels IGNORE; `mask_from_inputs`: masked
    where the input is padding instead, so the pad after the last real token counts."""
    target = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], PAD)], 1)
    masked = ids == PAD if mask_from_inputs else target == PAD
    return torch.where(masked, IGNORE, target)


def lm_loss(model: nn.Module, ids: torch.Tensor, mask_from_inputs: bool = False):
    target = labels(ids, mask_from_inputs)
    if hasattr(model, "config"):  # a Hugging Face model shifts its labels itself
        return model(input_ids=ids, labels=torch.where(ids == PAD, IGNORE, ids)).loss
    logits = model(ids)
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=IGNORE)


def run(model: nn.Module, mask_from_inputs: bool) -> dict:
    """Four probed AdamW steps, an evaluation of two batches after the second and the last."""

    def evaluate(step: int) -> None:
        if step % 2 == 1:
            model.eval()
            with torch.no_grad():
                for seed in (100, 101):
                    lm_loss(model, padded(seed), mask_from_inputs)
            model.train()

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [padded(step) for step in range(4)]
    return probe_checks(probed_run(model, optimizer, lm_loss, batches, padded(99), evaluate))[CHECK]


@pytest.mark.parametrize(("mask_from_inputs", "status"), [(True, "fail"), (False, "pass")])
def test_an_evaluation_scoring_the_pad_fails(uri, mask_from_inputs, status):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB))
    check = run(model, mask_from_inputs)
    assert check["status"] == status, check


def test_hugging_face_gpt2_evaluated_on_its_training_labels_passes(uri):
    torch.manual_seed(0)
    check = run(hugging_face_model("gpt2"), mask_from_inputs=False)
    assert check["status"] == "pass", check


def test_the_violation_is_the_finding_of_its_id():
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-3, second_lr=1e-3)
    facts.eval_only_target = (0, 492, 512)
    assert finding_ids(facts) == [CHECK]
