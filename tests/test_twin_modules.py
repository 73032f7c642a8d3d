"""A module called where its twin was meant (diag/invariants.py twin_called_instead;
model_checks.sibling_calls).

allenai/OLMo#222 and lucidrains/mmdit#4: a block normalised its feed-forward input with the
attention's LayerNorm, so the second norm was built and never trained. Read as call counts of
one forward: one twin never called while the other runs more often than their parent. Through
the probe of a plain loop with each kind of slip, a loop that reuses one layer on purpose
(shared weights, no twin left unused), and Hugging Face's GPT-2 and BERT as shipped."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hyprun.diag.invariants import twin_called_instead
from hyprun.diag.live_checks import LiveFacts
from tests.helpers import finding_ids, probed_check
from tests.test_stream_dropout import VOCAB, WIDTH, batch, hugging_face_model, loss_of

CHECK = "module_called_for_its_twin"


class Block(nn.Module):
    """Pre-norm: a mixing sublayer and a feed-forward one, each behind its own LayerNorm (or,
    `bug="norm"`, both behind norm1); the mixer's two projections (or, `bug="projection"`,
    one of them twice)."""

    def __init__(self, bug: str):
        super().__init__()
        self.bug = bug
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.q, self.k = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.ffn = nn.Sequential(
            nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        keys = self.q(h) if self.bug == "projection" else self.k(h)
        x = x + torch.tanh(self.q(h)) * keys
        return x + self.ffn(self.norm1(x) if self.bug == "norm" else self.norm2(x))


class Stack(nn.Module):
    """Two blocks applied in turn (or, `bug="layer"`, the first one twice; `shared`: one block
    built and applied twice on purpose)."""

    def __init__(self, bug: str = "", shared: bool = False):
        super().__init__()
        self.bug = bug
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(bug) for _ in range(1 if shared else 2)])
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for i in range(2):
            x = self.blocks[0 if self.bug == "layer" or len(self.blocks) == 1 else i](x)
        return self.head(x)


@pytest.mark.parametrize(
    ("model", "status", "unused"),
    [
        (lambda: Stack(), "pass", None),
        (lambda: Stack("norm"), "fail", "blocks.0.norm2"),
        (lambda: Stack("projection"), "fail", "blocks.0.k"),
        (lambda: Stack("layer"), "fail", "blocks.1"),
        (lambda: Stack(shared=True), "pass", None),
    ],
)
def test_through_the_probe(uri, model, status, unused):
    torch.manual_seed(0)
    check = probed_check(model(), loss_of, batch, CHECK)
    assert check["status"] == status, check
    assert unused is None or check["why"].startswith(unused), check


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_hugging_face_models_as_shipped_pass(uri, family):
    torch.manual_seed(0)
    assert probed_check(hugging_face_model(family), loss_of, batch, CHECK)["status"] == "pass"


def test_a_twin_left_unused_alone_is_not_this():
    """Built and never wired, its twin called once: another fault, not a twin called instead."""
    assert twin_called_instead([("block", {"block.norm1": 1, "block.norm2": 0}, 1)]) == []
    assert twin_called_instead([("layers", {"layers.0": 1, "layers.1": 0}, 0)]) == []
    assert len(twin_called_instead([("layers", {"layers.0": 2, "layers.1": 0}, 0)])) == 1


def test_the_violation_is_the_finding_of_its_id():
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    facts.twin_calls = [("blocks.0", {"blocks.0.norm1": 2, "blocks.0.norm2": 0}, 1)]
    assert finding_ids(facts) == [CHECK]
