"""The healthy reference (diag/reference.py): every training row is held to what healthy runs
measure, and findings show each cut number beside the healthy range."""

from __future__ import annotations

import pytest

from hyprun.diag.features import Feature
from hyprun.diag.reference import Reference, dynamics_features, healthy_range, load_reference
from hyprun.diag.triage import fire, load_tables, triage
from tests.test_triage import healthy

KNOWN_ALARMS = {"gpt/depth9_adamw": ["lr_high_with_flat_loss"]}
"""The healthy set's one in-sample alarm (bench/diagnosis/README.md: a 9-layer model at the
6-layer LR whose loss fell slowly): listed, so that a second one fails."""


def alarms(reference: Reference) -> dict[str, list[str]]:
    rows = load_tables()
    out = {}
    for name, run in reference.runs.items():
        ids = [f.id for f in fire(rows, {k: Feature(v, "") for k, v in run.items()})]
        if ids:
            out[name] = ids
    return out


def test_no_row_fires_on_a_healthy_reference_run():
    reference = load_reference()
    populations = {name.split("/")[0] for name in reference.runs}
    assert populations == {"gpt", "apps", "corpus"}  # ours and the foreign apps'
    assert alarms(reference) == KNOWN_ALARMS


def test_a_cut_inside_the_healthy_range_is_caught():
    """A row whose cut healthy runs pass fires on them: the check above would fail."""
    reference = load_reference()
    run = next(iter(reference.runs.values()))
    spiky = Reference(runs={"r": {**run, "grad_norm_max_over_median": 30.0}})
    assert "exploding_gradients" in alarms(spiky)["r"]


def test_the_reference_covers_what_the_training_rows_read():
    values = {f for run in load_reference().runs.values() for f in run}
    # flags that are never numbers on a healthy run (nan_module is a name or None) are absent;
    # wd_applied_over_declared and dropout_over_declared are read only where an app declares a
    # weight decay or a dropout rate above 0 through its knobs, and no healthy reference app
    # does (tests/test_lr_declared.py and tests/test_dropout_calls.py hold their cuts on loops)
    declared_only = {"wd_applied_over_declared", "dropout_over_declared"}
    assert dynamics_features() - values <= {"nan_module", *declared_only}


def test_a_finding_shows_its_cut_numbers_beside_the_healthy_range():
    ev = healthy()
    for block, scale in enumerate([1e-6, 1e-5, 0.05, 0.3]):
        key = f"grad/norm/blocks.{block}"
        ev.series[key] = [(s, scale) for s, _ in ev.series[key]]
    finding = next(f for f in triage(ev).findings if f.id == "vanishing_early_layers")
    values = load_reference().values("grad_layer_ratio")
    shown = f"healthy {min(values):.3g}-{max(values):.3g} ({len(values)} runs)"
    assert shown == healthy_range("grad_layer_ratio")
    assert any(
        line.startswith("grad_layer_ratio < 0.01") and shown in line for line in finding.details
    )


@pytest.mark.parametrize("feature", ["diverged", "no_such_feature"])
def test_no_range_where_healthy_runs_measure_nothing_to_compare(feature):
    assert healthy_range(feature, Reference(runs={"r": {"loss_last": 1.0}})) == ""


def test_each_cut_is_measured_against_the_healthy_extreme_on_its_side():
    from bench.margins import cuts, margin

    assert margin(">", 20.0, 1.0, 4.0) == (5.0, True)
    assert margin("<", 0.01, 0.1, 0.9) == (pytest.approx(10.0), True)
    assert margin(">", 0.25, -0.1, 0.0) == (pytest.approx(2.5), False)  # a distance in ranges
    found = {(cut.row, cut.feature): cut for cut in cuts()}
    spikes = found[("exploding_gradients", "grad_norm_max_over_median")]
    values = load_reference().values("grad_norm_max_over_median")
    assert spikes.margin == pytest.approx(spikes.threshold / max(values))
