"""L0 warnings that become findings (diag/tables/warnings.yaml) only with the harm they predict,
on crafted evidence (no training): a weight decay above its band is a finding when the weights'
norm fell below half its start or its pull per step is at least the step, and stays a warning
while neither shows. The fix the row names
is a card that the corpus's plain-loop app can run (its knobs map it)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.apps.run import folder_of
from bench.corpus.cards import applicable
from hyprun.diag.features import features
from hyprun.diag.triage import triage
from tests.test_triage import PROBE, N, drop_probes, healthy, pts

LOOP_APP = "bench.corpus.apps.loop.train:main"


def with_weight_decay(value: float, status: str = "warn"):
    """The healthy run with the L0 weight_decay check read as `status` at `value`."""
    ev = healthy()
    ev.static.append(
        {
            "id": "weight_decay",
            "status": status,
            "value": value,
            "threshold": "0 < weight_decay <= 0.3 for adam",
            "why": "weight decay this strong pulls weights to 0",
            "question": "Q1",
        }
    )
    return ev


def shrinking(ev, to: float):
    """The weights' norm falls geometrically from 50 to `to` x 50 over the run."""
    probes = np.arange(N // PROBE)
    ev.series["param/norm"] = pts(50 * to ** (probes / probes[-1]), PROBE)
    return ev


def test_the_norm_feature_reads_the_end_over_the_start():
    assert features(shrinking(healthy(), 0.01))["param_norm_growth"].value < 0.02
    assert 1.0 <= features(healthy())["param_norm_growth"].value < 1.1  # the norm grows


def test_weight_decay_above_the_band_is_a_finding_when_the_weights_shrink():
    ids = [f.id for f in triage(shrinking(with_weight_decay(30.0), 0.01)).findings]
    assert ids[0] == "static.weight_decay", ids


def test_weight_decay_above_the_band_stays_a_warning_while_the_norm_holds_and_steps_win():
    """Decay 0.5 at LR 1e-3 pulls 5e-4 per step, half the measured step (1e-3): no harm."""
    ids = [f.id for f in triage(with_weight_decay(0.5)).findings]
    assert "static.weight_decay" not in ids, ids


@pytest.mark.parametrize(
    ("decay", "shrink", "fires"),
    [
        (0.5, 1.0, False),  # above the band, but its pull (5e-4) is half the step: no harm seen
        (1.0, 1.0, True),  # pull 1e-3 = the measured step: the decay holds the weights
        (0.5, 0.3, True),  # the norm fell to 0.3x: the other harm, read alone
    ],
)
def test_a_weight_decay_warning_is_a_finding_on_either_harm(decay, shrink, fires):
    """One row, its harms OR'd (`when_any`): the norm fell below half, or the decay's pull per
    step (lr * wd) is at least the measured step (an update ratio equal to the peak LR)."""
    ev = with_weight_decay(decay)
    if shrink < 1:
        shrinking(ev, shrink)
    peak_lr = max(v for _, v in ev.series["train/lr"])  # ~1e-3
    ev.series["param/update_ratio"] = [(s, peak_lr) for s, _ in ev.series["param/update_ratio"]]
    diagnosis = triage(ev)
    finding = next((f for f in diagnosis.findings if f.id == "static.weight_decay"), None)
    assert (finding is not None) == fires, [f.id for f in diagnosis.findings]
    assert features(ev)["decay_pull_over_update"].value == pytest.approx(decay)
    if fires:
        assert {"param_norm_growth", "decay_pull_over_update"} <= set(finding.numbers)


def test_an_or_row_with_no_harm_measured_is_listed_as_not_judged():
    """Neither harm can be read without the parameter probes: the row is not judged, and
    names both."""
    ev = with_weight_decay(5.0)
    drop_probes(ev)
    diagnosis = triage(ev)
    skipped = {row["id"]: row for row in diagnosis.not_judged}
    assert "static.weight_decay" not in {f.id for f in diagnosis.findings}
    assert set(skipped["static.weight_decay"]["missing"]) == {
        "param_norm_growth",
        "decay_pull_over_update",
    }


def test_no_weight_decay_is_not_this_finding_even_with_shrinking_weights():
    ids = [f.id for f in triage(shrinking(with_weight_decay(0.0), 0.01)).findings]
    assert "static.weight_decay" not in ids, ids


def test_the_rows_card_runs_on_the_plain_loop_app():
    overrides = ["train.steps=120", "optim.weight_decay=30"]
    cards = applicable("loop", overrides, folder_of(LOOP_APP))
    assert cards["adamw_weight_decay"] == ["optim.weight_decay=0.1"], cards


def without_warmup(ev):
    """The L0 warmup check read as a live run without warmup reads it."""
    ev.static.append(
        {
            "id": "warmup",
            "status": "warn",
            "value": 1e-3,
            "threshold": "LR at step 0 below the peak, or rising at step 1 (Adam)",
            "why": "Adam without warmup",
            "question": "Q1",
        }
    )
    return ev


def surging(ev, factor: float):
    """The train loss climbs to `factor` x its first value at 5% of the run, then trains on."""
    loss = [v for _, v in ev.series["train/loss"]]
    loss[N // 20] = loss[0] * factor
    ev.series["train/loss"] = pts(loss)
    return ev


def test_the_early_rise_reads_a_surge_at_the_start_and_not_a_falling_loss():
    assert features(surging(healthy(), 1.5))["loss_early_rise"].value > 0.45
    assert features(healthy())["loss_early_rise"].value < 0.0  # a fresh model's loss only falls


def test_no_warmup_is_a_finding_when_the_loss_surges_early():
    ids = [f.id for f in triage(surging(without_warmup(healthy()), 1.5)).findings]
    assert "static.warmup" in ids[:1], ids


def test_no_warmup_stays_a_warning_while_the_loss_falls():
    ids = [f.id for f in triage(without_warmup(healthy())).findings]
    assert "static.warmup" not in ids, ids
