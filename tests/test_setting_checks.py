"""Settings read off a live run against the range they work in, and a loss rescaled after its
mean (diag/live_checks.py, diag/invariants.py): Adam's eps against the gradient's scale, the
dropout rate, the token weight of a one-micro-batch step. Each on crafted facts, through the
probe of a real loop with the setting planted as its report wrote it, and into the finding
named by the corpus cause id only with the harm it predicts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyprun.diag.evidence import Evidence
from hyprun.diag.invariants import loss_rescaled, losses_summed
from hyprun.diag.live_checks import LiveFacts, live_checks
from hyprun.diag.triage import triage
from hyprun.runner.job.probe import Probe
from tests.helpers import probe_checks

CHECKS = ("adam_eps", "dropout_rate", "loss_divided_twice")


def statuses(facts: LiveFacts) -> dict[str, str]:
    found = {c.id: c.status for c in live_checks(facts)}
    return {k: found[k] for k in CHECKS}


def facts(**changes) -> LiveFacts:
    found = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    for name, value in changes.items():
        setattr(found, name, value)
    return found


def test_a_mean_or_a_sum_keeps_its_scale_and_a_mean_divided_again_does_not():
    assert not loss_rescaled([(1.0, 512), (512.0, 512), (0.5, 512)])  # mean, sum, 0.5 x mean
    assert loss_rescaled([(1 / 512, 512)])  # the token mean divided by the tokens again
    assert loss_rescaled([(1 / 64, 512)])  # ... by the batch's 64 rows
    assert not loss_rescaled([(1 / 8, 512)])  # within sqrt(512) of the mean: a loss weight


def test_each_setting_check_skips_unread_passes_the_usual_range_and_warns_outside():
    assert set(statuses(facts()).values()) == {"skip"}
    usual = facts(adam_eps=1e-8, grad_rms=1e-3, dropout_max=(0.1, ["drop"]))
    usual.single_steps = [(1.0, 512)]
    assert statuses(usual) == dict.fromkeys(CHECKS, "pass")
    assert statuses(facts(adam_eps=0.1, grad_rms=1e-3))["adam_eps"] == "warn"
    assert statuses(facts(dropout_max=(0.9, ["drop"])))["dropout_rate"] == "warn"
    assert statuses(facts(single_steps=[(1 / 512, 512)]))["loss_divided_twice"] == "fail"
    sgd = facts(optimizer="SGD", adam_eps=0.1, grad_rms=1e-3)  # no eps in SGD's step
    assert statuses(sgd)["adam_eps"] == "skip"


def findings(found: LiveFacts, loss: list[tuple[int, float]]) -> list[str]:
    checks = [c.__dict__ for c in live_checks(found)]
    evidence = Evidence(static=checks, series={"train/loss": loss})
    return [f.id for f in triage(evidence).findings]


FALLING = [(step, 4.0 * 0.9**step) for step in range(20)]  # dropped 85%
FLAT = [(step, 4.0 - 0.01 * step) for step in range(20)]  # dropped 5%: the harm predicted


@pytest.mark.parametrize(
    ("finding", "setting"),
    [
        ("adam_eps_too_large", {"adam_eps": 0.1, "grad_rms": 1e-3}),
        ("dropout_rate_inverted", {"dropout_max": (0.9, ["drop"])}),
        ("momentum_lost", {"optimizer": "SGD", "momentum": 5e-4}),  # YudeWang/SEAM#21
        ("adam_beta2_too_low", {"betas": (0.9, 0.001)}),  # mila-iqia/blocks#1159
    ],
)
def test_a_setting_outside_its_range_is_a_finding_only_with_the_harm_it_predicts(finding, setting):
    assert finding not in findings(facts(**setting), FALLING)
    assert findings(facts(**setting), FLAT)[0] == finding


def test_beta2_warns_below_every_recipe_and_only_a_low_one_reads_as_the_cause():
    low = {c.id: c for c in live_checks(facts(betas=(0.9, 0.001)))}["adam_betas"]
    assert (low.status, low.value) == ("warn", 0.001) and "1 - beta2" in low.why
    usual = {c.id: c for c in live_checks(facts(betas=(0.9, 0.95)))}["adam_betas"]
    assert usual.status != "warn"
    high = facts(betas=(0.9, 0.999), heads=4)  # the high-beta2 warning: spikes, not this row
    assert [c.status for c in live_checks(high) if c.id == "adam_betas"] == ["warn"]
    assert "adam_beta2_too_low" not in findings(high, FLAT)


def test_sgd_momentum_warns_only_between_plain_and_heavy_ball():
    def status(momentum: float, optimizer: str = "SGD") -> str:
        found = facts(optimizer=optimizer, momentum=momentum)
        return {c.id: c.status for c in live_checks(found)}["sgd_momentum"]

    assert (status(0.0), status(0.9), status(5e-4)) == ("pass", "pass", "warn")
    assert status(5e-4, optimizer="AdamW") == "skip"


def test_a_first_loss_far_above_the_uniform_guess_reads_as_an_init_too_large():
    uniform = torch.log(torch.tensor(64.0)).item()
    for start, expected in ((1.02 * uniform, False), (2.5 * uniform, True)):
        loss = [(step, start * 0.9**step) for step in range(20)]
        evidence = Evidence(config={"model": {"vocab_size": 64}}, series={"train/loss": loss})
        assert ("init_too_large" in [f.id for f in triage(evidence).findings]) is expected


def test_a_rescaled_loss_is_a_finding_by_itself():
    assert findings(facts(single_steps=[(1 / 512, 512)]), FALLING)[0] == "loss_divided_twice"


def test_a_summed_loss_warns_and_is_a_finding_only_where_the_run_blew_up():
    assert losses_summed([(512.0, 512), (300.0, 512)]) and not losses_summed([(1.0, 512)])
    summed = facts(single_steps=[(512.0, 512)])
    assert statuses(summed)["loss_divided_twice"] == "pass"
    assert {c.id: c.status for c in live_checks(summed)}["loss_summed"] == "warn"
    blown_up = [(0, 4.0), (1, 9.0), (2, float("nan"))]
    assert findings(summed, blown_up)[0] == "loss_summed_not_averaged"  # ShusenTang#75
    assert "loss_summed_not_averaged" not in findings(summed, FALLING)  # an LR set for a sum


class TinyLM(nn.Module):
    def __init__(self, dropout: float):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(16, 32)
        self.layer = nn.TransformerEncoderLayer(32, 2, 64, dropout, batch_first=True)
        self.head = nn.Linear(32, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.head(self.layer(self.embed(ids), src_mask=mask, is_causal=True))


OPTIMIZERS = {
    "adam_l2": lambda params: torch.optim.Adam(params, lr=1e-3, weight_decay=0.1),
    "adam_small_l2": lambda params: torch.optim.Adam(params, lr=1e-3, weight_decay=5e-4),
    "adamw_decay": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1),
}
"""Optimizers planted by name; any other bug trains with AdamW at its default decay."""


def probed(bug: str = "", ids: tuple[str, ...] = CHECKS) -> dict[str, dict]:
    """A plain loop with one report's setting planted: the checks `ids` as the probe recorded."""
    model = TinyLM(0.9 if bug == "keep_prob_as_p" else 0.1)  # keras-deeplab-v3-plus#4
    eps = 0.1 if bug == "eps" else 1e-8  # mlpnlp-nmt#4
    build = OPTIMIZERS.get(bug, lambda params: torch.optim.AdamW(params, lr=1e-3, eps=eps))
    optimizer = build(model.parameters())
    probe = Probe(model, optimizer, step_unit="steps", every_steps=0)
    rng = torch.Generator().manual_seed(1)
    for _ in range(4):
        tokens = torch.randint(16, (4, 13), generator=rng)
        logits = model(tokens[:, :-1]).flatten(0, 1)
        total = F.cross_entropy(logits, tokens[:, 1:].flatten(), reduction="sum")
        loss = total / total.new_tensor(48.0)
        if bug == "averaged_twice":  # PyTorch-YOLOv3#137: the mean divided by the count again
            loss = loss / 48
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    probe.close()
    return {k: c for k, c in probe_checks(probe.run_id).items() if k in ids}


def test_through_the_probe_each_planted_setting_is_read_and_only_it(uri):
    healthy = probed()
    assert {k: c["status"] for k, c in healthy.items()} == dict.fromkeys(CHECKS, "pass")
    assert healthy["adam_eps"]["value"] < 1e-3  # eps 1e-8 against gradients of ~1e-2
    eps = probed("eps")
    assert eps["adam_eps"]["status"] == "warn" and eps["adam_eps"]["value"] > 1
    assert eps["dropout_rate"]["status"] == eps["loss_divided_twice"]["status"] == "pass"
    dropout = probed("keep_prob_as_p")
    assert dropout["dropout_rate"]["status"] == "warn" and dropout["dropout_rate"]["value"] == 0.9
    assert "layer.dropout" in dropout["dropout_rate"]["why"]
    twice = probed("averaged_twice")
    assert twice["loss_divided_twice"]["status"] == "fail"
    assert "weigh 0.0208" in twice["loss_divided_twice"]["why"]  # 1/48 of a mean's weight


def test_first_loss_ratios_reads_each_probed_run_of_a_benchmark_workdir(workdir, monkeypatch):
    from bench.first_loss import first_loss_ratios

    (workdir / "entry").mkdir()
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/entry/mlflow.db")
    probed()
    [(ratio, folder)] = first_loss_ratios(workdir)
    assert folder == "entry" and 0.9 < ratio < 1.1  # a fresh model: near the uniform guess


def test_adam_l2_decay_warns_above_the_gradients_scale_and_is_a_finding_with_shrinking_weights():
    def decay(**changes) -> str:
        found = facts(optimizer="Adam", weight_decay=0.1, weight_rms=0.2, grad_rms=2e-3)
        for name, value in changes.items():
            setattr(found, name, value)
        return {c.id: c.status for c in live_checks(found)}["adam_coupled_decay"]

    assert decay() == "warn"  # 0.1 x 0.2 = 10x the gradient's RMS
    assert decay(weight_decay=5e-4) == "pass"  # an L2 Adam is tuned with: 0.05x
    assert decay(optimizer="AdamW") == decay(decoupled_decay=True) == "skip"
    coupled = facts(optimizer="Adam", weight_decay=0.1, weight_rms=0.2, grad_rms=2e-3)
    checks = [c.__dict__ for c in live_checks(coupled)]
    for norm_end, named in ((30.0, True), (75.0, False)):  # pulled to 0, or held
        norm = [(step, 76.0 + (norm_end - 76.0) * step / 19) for step in range(20)]
        series = {"train/loss": FALLING, "param/norm": norm}
        ids = [f.id for f in triage(Evidence(static=checks, series=series)).findings]
        assert ("adam_l2_not_decoupled" in ids) is named, ids


def test_through_the_probe_adam_given_adamws_decay_is_read_and_adamw_is_not(uri):
    def read(bug: str) -> dict:
        return probed(bug, ids=("adam_coupled_decay",))["adam_coupled_decay"]

    coupled = read("adam_l2")  # mapbox/robosat#166: AdamW's decay given to Adam
    assert coupled["status"] == "warn" and coupled["value"] > 1, coupled
    assert read("adam_small_l2")["status"] == "pass"
    assert read("adamw_decay")["status"] == "skip"
