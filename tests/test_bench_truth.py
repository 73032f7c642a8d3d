"""The diagnosis benchmark's labels (bench/diagnosis/truth.py): a card counts as a scenario's fix
only where a measurement on seeds the benchmark never scores says it removes the fault."""

from __future__ import annotations

import json
import math

import pytest

from bench.diagnosis import truth
from bench.diagnosis.run import load_scenarios

_, SCENARIOS = load_scenarios()
FAULTS = [s for s in SCENARIOS if s.kind == "fault"]
MEASURED = {r["scenario"]: r for r in json.loads((truth.RESULTS / "truth.json").read_text())}
_, FAMILY_FAULTS = truth.family_scenarios()
MEASURED_FAMILIES = {
    r["scenario"]: r for r in json.loads((truth.RESULTS / "truth_families.json").read_text())
}


def test_a_clear_improvement_beyond_the_min_effect_removes_the_fault():
    row = truth.effect([5.0, 5.1, 5.2, 5.15], [4.0, 4.1, 4.05, 3.9], "min", 0.01)
    assert row["removes"] and row["improvement"] == pytest.approx(0.215, abs=0.01)
    assert row["p"] < 0.05


def test_an_improvement_under_the_min_effect_or_within_noise_does_not():
    assert not truth.effect([5.0, 5.01, 5.02, 5.03], [4.99, 5.0, 5.01, 5.02], "min", 0.01)[
        "removes"
    ]
    assert not truth.effect([5.0, 4.0, 6.0, 4.5], [4.9, 3.8, 5.9, 4.6], "min", 0.01)["removes"]
    assert not truth.effect([5.0, 5.1, 5.2], [4.0, 4.1, 4.05], "min", 0.01)["removes"]  # 3 a side


def test_one_blown_up_seed_does_not_hide_a_clear_fix():
    """Unclipped SGD (the no_clip family, 12 truth seeds): 11 planted runs ended near 5.3 and one
    at 2.4e7 without a NaN. Welch's t read that seed as variance (p = 0.17); the ranks do not."""
    planted = [5.315, 5.276, 5.269, 5.287, 5.291, 5.264, 5.249, 5.296, 24213505.5, 5.35, 5.283]
    clipped = [4.597, 5.254, 2.721, 5.221, 2.822, 5.157, 3.126, 4.221, 5.284, 3.597, 3.326]
    row = truth.effect([*planted, 5.297], [*clipped, 2.764], "min", 0.01)
    assert row["removes"] and row["p"] < 0.01
    assert row["improvement"] == pytest.approx(0.26, abs=0.01)  # the median, not the mean's 100%


def test_throughput_improves_upward():
    assert truth.effect([100.0, 101, 99, 100], [130.0, 129, 131, 130], "max", 0.05)["removes"]
    assert not truth.effect([130.0, 129, 131, 130], [100.0, 101, 99, 100], "max", 0.05)["removes"]


def test_a_fault_that_diverges_is_removed_only_by_a_card_whose_runs_all_finish():
    diverged = [math.inf, math.inf]
    assert truth.effect(diverged, [4.0, 4.1], "min", 0.01)["removes"]
    assert not truth.effect(diverged, [4.0, math.inf], "min", 0.01)["removes"]
    assert not truth.effect([4.0, 4.1], [3.0, math.inf], "min", 0.01)["removes"]
    assert truth.effect([math.inf, 4.5], [4.0, 4.1], "min", 0.01)["removes"]
    assert not truth.effect([math.inf, 4.0], [4.5, 4.6], "min", 0.01)["removes"]


@pytest.mark.parametrize("scenario", FAULTS, ids=[s.name for s in FAULTS])
def test_each_label_is_what_the_truth_seeds_measured(scenario):
    assert_label_measured(scenario, MEASURED)


@pytest.mark.parametrize("family", FAMILY_FAULTS, ids=[s.name for s in FAMILY_FAULTS])
def test_each_family_fix_list_is_what_the_truth_seeds_measured(family):
    """The family benchmark's card-order comparison counts a card in the fix list as confirmed:
    that list is measured too (bench/diagnosis/results/truth_families.md)."""
    assert_label_measured(family, MEASURED_FAMILIES)


def assert_label_measured(scenario, measured: dict) -> None:
    """Every card labelled a fix was measured to remove the fault, and every card measured to
    remove it is labelled (a fault with no fix card measures nothing)."""
    if not scenario.fix:
        assert scenario.name not in measured or not any(
            row["removes"] for row in measured[scenario.name]["cards"]
        )
        return
    rows = {row["card"]: row for row in measured[scenario.name]["cards"]}
    assert set(scenario.fix) <= set(rows), f"unmeasured labels: {set(scenario.fix) - set(rows)}"
    removing = {card for card, row in rows.items() if row["removes"]}
    assert set(scenario.fix) == removing


def test_an_unknown_scenario_is_refused_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "truth"
    assert truth.main(["--only", "no_such_scenario", "--out", str(out)]) == 2
    assert "no fault scenario" in capsys.readouterr().err
    assert not out.exists()


def test_an_unknown_family_is_refused_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "truth"
    assert truth.main(["--families", "--only", "no_such_family", "--out", str(out)]) == 2
    assert "no fault family" in capsys.readouterr().err.splitlines()[-1]
    assert not out.exists()


def test_an_unknown_card_is_refused_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "truth"
    assert truth.main(["--only", "lr_too_low", "--cards", "no_such_card", "--out", str(out)]) == 2
    assert "no card no_such_card" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_a_measured_label_end_to_end_and_a_partial_rerun_keeps_the_other_rows(tmp_path):
    """Real jobs through `hyprun train` and their MLflow files: LR x100 too low is removed by
    lr_up_10x on the truth seeds; a second, partial run replaces only its own row."""
    out = tmp_path / "truth"
    out.mkdir()
    (out / "truth.json").write_text(json.dumps([MEASURED["bf16_numerics"]]))
    assert truth.main(["--only", "lr_too_low", "--seeds", "4", "--out", str(out)]) == 0
    results = {r["scenario"]: r for r in json.loads((out / "truth.json").read_text())}
    assert set(results) == {"bf16_numerics", "lr_too_low"}
    (row,) = results["lr_too_low"]["cards"]
    assert row["card"] == "lr_up_10x" and row["seeds"] == 4 and len(row["planted"]) == 4
    assert row["removes"] and row["improvement"] > 0.01, row
    assert results["bf16_numerics"] == MEASURED["bf16_numerics"]
    assert "| lr_too_low | lr_up_10x | yes |" in (out / "truth.md").read_text()


def test_too_few_seeds_to_reach_significance_are_refused_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "truth"
    assert truth.main(["--only", "lr_too_low", "--seeds", "3", "--out", str(out)]) == 2
    assert "at least 4 seeds" in capsys.readouterr().err
    assert not out.exists()


def test_rescore_without_a_recorded_table_is_refused_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "truth"
    assert truth.main(["--rescore", "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("--rescore needs a recorded")
    assert not out.exists()


@pytest.mark.parametrize(
    "extra", [["--only", "lr_too_low"], ["--cards", "dedup"], ["--seeds", "6"]]
)
def test_rescore_with_a_run_option_is_refused_and_nothing_is_written(tmp_path, capsys, extra):
    out = tmp_path / "truth"
    assert truth.main(["--rescore", *extra, "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("--rescore re-reads every recorded row")
    assert not out.exists()


def test_rescore_reads_the_recorded_rows_under_the_current_rule(tmp_path):
    out = tmp_path / "truth"
    out.mkdir()
    recorded = json.loads((truth.RESULTS / "truth.json").read_text())
    (out / "truth.json").write_text(json.dumps(recorded))
    (out / "truth.md").write_text("Last run earlier\n")
    assert truth.main(["--rescore", "--out", str(out)]) == 0
    assert json.loads((out / "truth.json").read_text()) == truth.rescore(recorded)
    assert "Last run earlier" in (out / "truth.md").read_text()
