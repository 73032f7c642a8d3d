"""The model-level invariants (runner/job/model_checks.py, diag/invariants.py): evaluation is
repeatable, a causal language model reads no later token, nll_loss gets log-probabilities.
Each on a tiny language model with its bug planted the way its report wrote it, its healthy
twin, a Hugging Face GPT-2 and a Lightning-style list batch, then through the probe of a real
loop and into the finding named by the corpus cause id."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyprun.diag.evidence import Evidence
from hyprun.diag.live_checks import LiveFacts, live_checks
from hyprun.diag.triage import triage
from hyprun.runner.job.model_checks import future_influence, repeat_gap
from hyprun.runner.job.probe import Probe
from tests.helpers import probe_checks

VOCAB, WIDTH = 16, 12


class TinyLM(nn.Module):
    """One attention layer over embeddings; the bugs are the corpus's later rows."""

    def __init__(self, causal: bool = True, dropout_ignores_eval: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.causal, self.dropout_ignores_eval = causal, dropout_ignores_eval
        self.embed = nn.Embedding(VOCAB, 32)
        self.layer = nn.TransformerEncoderLayer(32, 2, 64, 0.0, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        # pytorch-fm#21: F.dropout without training= drops in eval mode too
        h = F.dropout(h, 0.1, training=True if self.dropout_ignores_eval else self.training)
        width = ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(width) if self.causal else None
        return self.head(self.layer(h, src_mask=mask, is_causal=self.causal))


def batch(rows: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(VOCAB, (rows, WIDTH + 1), generator=torch.Generator().manual_seed(3))
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model: nn.Module, pair, nll_dim: int | None = None) -> torch.Tensor:
    """Cross-entropy on the logits, or (`nll_dim`) nll_loss after a log-softmax over that
    dimension: -1 the classes, 0 the batch (pointnet.pytorch#27)."""
    x, y = pair
    logits = model(x)
    if nll_dim is not None:
        return F.nll_loss(logits.log_softmax(nll_dim).flatten(0, 1), y.flatten())
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def test_evaluation_repeats_unless_dropout_ignores_eval_mode():
    pair = batch()
    healthy, buggy = TinyLM(), TinyLM(dropout_ignores_eval=True)
    assert repeat_gap(healthy, lambda: loss_of(healthy, pair)) == 0.0
    assert repeat_gap(buggy, lambda: loss_of(buggy, pair)) > 1e-4
    assert healthy.training  # the mode is put back


def test_the_random_stream_is_the_same_with_and_without_the_checks():
    model, pair = TinyLM(dropout_ignores_eval=True), batch()
    torch.manual_seed(7)
    repeat_gap(model, lambda: loss_of(model, pair))
    future_influence(model, pair, lambda b: loss_of(model, b))
    after_checks = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(after_checks, torch.rand(3))


def test_a_model_without_its_causal_mask_moves_its_early_outputs():
    pair, healthy = batch(), TinyLM()
    assert future_influence(healthy, pair, lambda b: loss_of(healthy, b)) == 0.0
    leaky = TinyLM(causal=False)
    assert future_influence(leaky, pair, lambda b: loss_of(leaky, b)) > 1e-2
    # dropout that still draws in eval mode draws the same masks for both forwards
    both = TinyLM(dropout_ignores_eval=True)
    assert future_influence(both, pair, lambda b: loss_of(both, b)) == 0.0


def test_a_lightning_style_batch_shifted_inside_the_loss_is_read_too():
    """A list of one token tensor, the model fed tokens[:, :-1]: positions shift by one."""
    tokens = torch.randint(VOCAB, (4, WIDTH + 1), generator=torch.Generator().manual_seed(5))

    def step(model, list_batch):
        ids = list_batch[0]
        return F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())

    healthy, leaky = TinyLM(), TinyLM(causal=False)
    assert future_influence(healthy, [tokens], lambda b: step(healthy, b)) == 0.0
    assert future_influence(leaky, [tokens], lambda b: step(leaky, b)) > 1e-2


def test_a_hugging_face_gpt2_with_padding_reads_no_later_token():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=WIDTH, n_embd=32, n_layer=1, n_head=2)
    model = GPT2LMHeadModel(config)
    ids, _ = batch()
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0  # right padding
    hf = {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}
    assert future_influence(model, hf, lambda b: model(**b).loss) == 0.0
    assert repeat_gap(model, lambda: model(**hf).loss) == 0.0


def test_an_unreadable_batch_is_not_judged():
    model = TinyLM()
    floats = (torch.randn(4, WIDTH), torch.randn(4))
    assert future_influence(model, floats, lambda b: b[0].sum()) is None


def facts(**changes) -> LiveFacts:
    found = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    found.label_reads = [(0.05, 1.0, 0.05)]  # the targets are the next tokens
    for name, value in changes.items():
        setattr(found, name, value)
    return found


def statuses(found: LiveFacts) -> dict[str, str]:
    checks = {c.id: c.status for c in live_checks(found)}
    return {
        k: checks[k]
        for k in ("softmax_wrong_dim", "functional_dropout_in_eval", "causal_mask_missing")
    }


def test_each_check_skips_unread_passes_healthy_and_fails_its_violation():
    assert set(statuses(facts()).values()) == {"skip"}
    healthy = facts(nll_inputs=[1e-6], eval_gap=0.0, future_influence=0.0)
    assert set(statuses(healthy).values()) == {"pass"}
    assert statuses(facts(nll_inputs=[0.0, 2.3]))["softmax_wrong_dim"] == "fail"
    assert statuses(facts(eval_gap=1e-3))["functional_dropout_in_eval"] == "fail"
    assert statuses(facts(future_influence=0.3))["causal_mask_missing"] == "fail"
    # an encoder trained on another task may read the whole row: not judged
    classifier = facts(future_influence=0.3, label_reads=[])
    assert statuses(classifier)["causal_mask_missing"] == "skip"


@pytest.mark.parametrize(
    "check",
    ["softmax_wrong_dim", "functional_dropout_in_eval", "causal_mask_missing"],
)
def test_a_failed_model_check_is_the_finding_named_by_the_corpus_cause_id(check):
    violated = {
        "softmax_wrong_dim": {"nll_inputs": [2.3]},
        "functional_dropout_in_eval": {"eval_gap": 1e-3},
        "causal_mask_missing": {"future_influence": 0.3},
    }[check]
    checks = [c.__dict__ for c in live_checks(facts(**violated))]
    assert triage(Evidence(static=checks)).findings[0].id == check


def probed_loop(bug: str = "") -> dict[str, str]:
    """A plain loop with the probe attached and one bug planted: the new checks' statuses."""
    model = TinyLM(causal=bug != "causal", dropout_ignores_eval=bug == "dropout")
    dim = {"log_softmax": 0, "nll": -1}.get(bug)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = Probe(
        model,
        optimizer,
        step_unit="steps",
        every_steps=2,
        heldout=batch(),
        loss_fn=lambda net, pair: loss_of(net, pair, dim),
    )
    for step in range(4):
        loss = loss_of(model, batch(rows=4 + step), dim)
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    probe.close()
    checks = {k: c["status"] for k, c in probe_checks(probe.run_id).items()}
    return {
        k: checks[k]
        for k in ("softmax_wrong_dim", "functional_dropout_in_eval", "causal_mask_missing")
    }


def test_through_the_probe_each_bug_fails_its_own_check_and_only_it(uri):
    assert probed_loop() == {
        "softmax_wrong_dim": "skip",
        "functional_dropout_in_eval": "pass",
        "causal_mask_missing": "pass",
    }
    dropout = probed_loop("dropout")
    assert dropout["functional_dropout_in_eval"] == "fail"
    assert dropout["causal_mask_missing"] == "pass"
    causal = probed_loop("causal")
    assert causal["causal_mask_missing"] == "fail"
    assert causal["functional_dropout_in_eval"] == "pass"
    assert probed_loop("nll")["softmax_wrong_dim"] == "pass"  # log-softmax over the classes
    log_softmax = probed_loop("log_softmax")
    assert log_softmax["softmax_wrong_dim"] == "fail"
    assert log_softmax["functional_dropout_in_eval"] == "pass"
