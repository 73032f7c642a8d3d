"""The structure and optimizer-state invariants (runner/job/model_checks.py structure,
runner/job/invariant_hooks.py, diag/invariants.py): a residual stream runs through each block, a
nonlinearity sits between two linear layers, a fresh model's norm gains start near 1, and the
optimizer keeps its state. Each on a hand-written pre-norm block with its bug planted the way its
report wrote it, through the probe of a real loop, and into the finding named by the corpus
cause id; the healthy GPT-2 of transformers and a LoRA-style bottleneck are read as healthy."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from bench.corpus.apps.loop.train import build
from bench.corpus.compose import app_config
from hyprun.diag.evidence import Evidence
from hyprun.diag.invariants import stream_not_carried
from hyprun.diag.live_checks import LiveFacts, live_checks
from hyprun.diag.triage import triage
from hyprun.runner.job.model_checks import structure
from hyprun.runner.job.probe import Probe
from tests.helpers import probe_checks

VOCAB, WIDTH, SEQ = 32, 16, 12
CHECKS = ("residual_connection_dropped", "activation_missing", "norm_gains_small")
CHECKS += ("optimizer_state_reset", "dropout_scale_wrong", "heldout_overlap")


class Block(nn.Module):
    """One pre-norm transformer block, written out."""

    def __init__(self, bug: str):
        super().__init__()
        self.bug = bug
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, 2, batch_first=True)
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        h = self.norm1(x)
        attended = self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        x = attended if self.bug == "stream_overwritten" else x + attended  # BitNet#32
        hidden = self.up(self.norm2(x))
        if self.bug != "no_activation":  # YujiaBao/ls#1: Linear, Linear
            hidden = F.gelu(hidden)
        return x + self.down(hidden)


class TinyLM(nn.Module):
    def __init__(self, bug: str = ""):
        super().__init__()
        torch.manual_seed(0)
        self.bug = bug
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(bug), Block(bug)])
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)
        if bug == "norm_init":  # transformers#143: one normal init for every weight
            for module in self.modules():
                if isinstance(module, nn.LayerNorm):
                    nn.init.normal_(module.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        if self.training and self.bug == "dropout_by_p":  # theanets PR 123: kept / p
            h = h * (torch.rand_like(h) >= 0.1) / 0.1
        elif self.training:
            h = F.dropout(h, 0.1)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model: nn.Module, pair) -> torch.Tensor:
    x, y = pair
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def test_the_structure_read_sees_a_dropped_stream_and_a_missing_activation_only_there():
    def read(model):
        return structure(model, lambda: loss_of(model, batch(0)))

    pairs, chains = read(TinyLM())
    assert len(pairs) == 2 and min(c for c, _ in pairs.values()) > 0.9 and chains == []
    assert stream_not_carried(pairs) == []
    pairs, _ = read(TinyLM("stream_overwritten"))
    assert len(stream_not_carried(pairs)) == 2
    _, chains = read(TinyLM("no_activation"))
    assert chains == ["blocks.0.up -> blocks.0.down", "blocks.1.up -> blocks.1.down"]
    # the corpus loop at init std 1 (EasyLM#114): branches outweigh an intact stream, not judged
    corpus_loop, *_ = build(app_config("loop", ["bug.init_std_one=true"]))
    x, y = batch(0)
    pairs, _ = structure(
        corpus_loop, lambda: F.cross_entropy(corpus_loop(x).flatten(0, 1), y.flatten())
    )
    assert any(cosine < 0.25 and growth > 4 for cosine, growth in pairs.values())
    assert stream_not_carried(pairs) == []
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB))
    ids = batch(0)[0]
    pairs, chains = structure(gpt2, lambda: gpt2(input_ids=ids, labels=ids).loss)
    assert len(pairs) == 2 and stream_not_carried(pairs) == [] and chains == []


def test_a_bottleneck_or_an_in_place_activation_is_no_linear_pair():
    lora = nn.Sequential(nn.Linear(WIDTH, 2), nn.Linear(2, WIDTH))  # low rank on purpose
    relu = nn.Sequential(nn.Linear(WIDTH, 64), nn.ReLU(inplace=True), nn.Linear(64, WIDTH))
    plain = nn.Sequential(nn.Linear(WIDTH, 64), nn.Dropout(0.1), nn.Linear(64, WIDTH))
    x = torch.randn(3, WIDTH)
    found = {
        name: structure(m, lambda m=m: m(x).sum())[1]
        for name, m in {"lora": lora, "relu": relu, "plain": plain}.items()
    }
    assert found == {"lora": [], "relu": [], "plain": ["0 -> 2"]}


def probed_loop(bug: str = "") -> dict[str, str]:
    """A plain loop with the probe attached and one bug planted: the four checks' statuses."""
    model = TinyLM(bug)
    if bug.startswith("sgd"):
        momentum = 0.9 if bug.startswith("sgd_momentum") else 0.0
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = Probe(
        model, optimizer, step_unit="steps", every_steps=2, heldout=batch(99), loss_fn=loss_of
    )
    for step in range(6):
        if bug == "state_reset" and step == 3:  # a fresh Adam each epoch: moments start over
            optimizer.state.clear()
        if bug == "sgd_momentum_reset":  # the buffer made afresh by every step (pytorch_optimizer
            for state in optimizer.state.values():  # PR 516): SGD without its momentum
                state.pop("momentum_buffer", None)
        rows = batch(99 if bug == "heldout_from_train" and step == 2 else step)  # marin PR 2700
        loss = loss_of(model, rows)
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    probe.close()
    checks = probe_checks(probe.run_id)
    return {check: checks[check]["status"] for check in CHECKS}


def test_through_the_probe_each_bug_fails_its_own_check_and_only_it(uri):
    assert set(probed_loop().values()) == {"pass"}
    assert probed_loop("sgd")["optimizer_state_reset"] == "skip"  # no step count nor momentum
    assert probed_loop("sgd_momentum")["optimizer_state_reset"] == "pass"
    assert probed_loop("sgd_momentum_reset")["optimizer_state_reset"] == "fail"
    for bug, check, status in [
        ("stream_overwritten", "residual_connection_dropped", "fail"),
        ("no_activation", "activation_missing", "fail"),
        ("norm_init", "norm_gains_small", "warn"),
        ("state_reset", "optimizer_state_reset", "fail"),
        ("dropout_by_p", "dropout_scale_wrong", "fail"),
        ("heldout_from_train", "heldout_overlap", "fail"),
    ]:
        found = probed_loop(bug)
        assert found.pop(check) == status, bug
        assert set(found.values()) == {"pass"}, bug


def facts(**changes) -> LiveFacts:
    found = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    for name, value in changes.items():
        setattr(found, name, value)
    return found


@pytest.mark.parametrize(
    "changes, finding",
    [
        ({"stream_pairs": {"b.norm1 -> b.norm2": (0.02, 0.3)}}, "residual_connection_dropped"),
        ({"linear_chains": ["b.up -> b.down"]}, "activation_missing"),
        ({"state_resets": [3]}, "optimizer_state_reset"),
    ],
)
def test_a_violation_is_the_finding_named_by_the_corpus_cause_id(changes, finding):
    checks = [c.__dict__ for c in live_checks(facts(**changes))]
    assert [f.id for f in triage(Evidence(static=checks)).findings] == [finding]


def test_small_norm_gains_are_a_finding_on_a_fresh_model_only():
    checks = [c.__dict__ for c in live_checks(facts(norm_gains={"norm": 0.02, "b.norm1": 1.0}))]
    fresh = [(step, math.log(VOCAB) * (1 - 0.05 * step)) for step in range(10)]
    trained = [(step, 0.5 * math.log(VOCAB) * (1 - 0.05 * step)) for step in range(10)]
    ids = [
        [
            f.id
            for f in triage(
                Evidence(
                    static=checks,
                    config={"model": {"vocab_size": VOCAB}},
                    series={"train/loss": loss},
                )
            ).findings
        ]
        for loss in (fresh, trained)
    ]
    assert "layer_norm_init_wrong" in ids[0] and "layer_norm_init_wrong" not in ids[1]
