"""One cut shared by every row, on the healthy z-score scale (bench/shared_cut.py)."""

from __future__ import annotations

import math

import pytest

from bench.shared_cut import changes, main, move_cuts, shared_threshold, write_tables
from hyprun.diag.reference import Reference, load_reference
from hyprun.diag.triage import load_tables

SPREAD = [1.0, 2.0, 4.0, 8.0, 1.0, 2.0, 4.0, 8.0]


def test_a_positive_feature_is_cut_in_log_space_on_the_side_its_op_reads():
    logs = [math.log(v) for v in SPREAD]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    assert shared_threshold(SPREAD, ">", 2.0) == pytest.approx(math.exp(mean + 2 * sd), rel=1e-3)
    assert shared_threshold(SPREAD, "<=", 2.0) == pytest.approx(math.exp(mean - 2 * sd), rel=1e-3)


def test_a_signed_feature_is_cut_on_its_own_scale():
    signed = [-1.0, 1.0] * 4
    assert shared_threshold(signed, ">", 3.0) == pytest.approx(3 * math.sqrt(8 / 7), rel=1e-3)


def test_no_spread_or_too_few_runs_leave_the_cut_alone():
    assert shared_threshold([0.0] * 20, ">=", 2.0) is None  # loss_spikes: every healthy run 0
    assert shared_threshold(SPREAD[:5], ">", 2.0) is None


def test_only_ordering_cuts_of_training_rows_on_reference_features_move():
    reference = Reference(runs={f"run {i}": {"grad_norm_median": v} for i, v in enumerate(SPREAD)})
    rows = [
        {
            "question": "Q1",
            "when": [
                {"feature": "grad_norm_median", "op": "<", "threshold": 1.0e-4},
                {"feature": "diverged", "op": "==", "threshold": 1},
                {"feature": "not_in_reference", "op": ">", "threshold": 5.0},
            ],
            "when_any": [[{"feature": "grad_norm_median", "op": ">", "threshold": 100.0}]],
        },
        {"question": "Q3", "when": [{"feature": "grad_norm_median", "op": ">", "threshold": 9.0}]},
    ]
    assert move_cuts(rows, reference, 2.0) == {"moved": 2, "kept": 0}
    assert rows[0]["when"][0]["threshold"] == shared_threshold(SPREAD, "<", 2.0)
    assert rows[0]["when_any"][0][0]["threshold"] == shared_threshold(SPREAD, ">", 2.0)
    assert [c["threshold"] for c in rows[0]["when"][1:]] == [1, 5.0]
    assert rows[1]["when"][0]["threshold"] == 9.0  # an efficiency row measures the machine


def test_one_rule_at_a_time_moves_only_the_rows_named():
    reference = Reference(runs={f"run {i}": {"grad_norm_median": v} for i, v in enumerate(SPREAD)})
    rows = [
        {
            "id": id_,
            "question": "Q1",
            "when": [{"feature": "grad_norm_median", "op": ">", "threshold": 9.0}],
        }
        for id_ in ("a", "b")
    ]
    assert move_cuts(rows, reference, 2.0, only={"b"}) == {"moved": 1, "kept": 0}
    assert [row["when"][0]["threshold"] == 9.0 for row in rows] == [True, False]


def test_the_moved_tables_load_and_as_they_are_they_are_the_tables(tmp_path):
    (tmp_path / "own").mkdir()
    (tmp_path / "shared").mkdir()
    assert write_tables(tmp_path / "own", None, load_reference()) == {"moved": 0, "kept": 0}
    assert load_tables(tmp_path / "own") == [
        row.model_copy(update={"source": str(tmp_path / "own" / row.source.rsplit("/", 1)[1])})
        for row in load_tables()
    ]
    counts = write_tables(tmp_path / "shared", 2.5, load_reference())
    assert counts["moved"] > 30  # bench.margins lists 43 ordering cuts on reference features
    moved = {row.id: row for row in load_tables(tmp_path / "shared")}
    assert moved["vanishing_gradients"].when[0].threshold != 1.0e-4


def test_changes_name_the_faults_that_moved_and_the_healthy_runs_that_fire():
    own = {"ranks": {"a": 1, "b": 2, "c": None}, "alarms": {"h1": [], "h2": []}}
    shared = {"ranks": {"a": 1, "b": 1, "c": None}, "alarms": {"h1": ["loss_flat"], "h2": []}}
    assert changes(own, shared) == ["  b: rank 2 -> 1", "  h1 (healthy): ['loss_flat']"]


@pytest.mark.parametrize(
    "args, named",
    [
        ([], "holds no split.json"),
        (["--apps", "APPS"], "holds no recorded app runs"),
        (["--rows", "attention_colapse"], "names no table row ['attention_colapse']"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(tmp_path, capsys, args, named):
    workdir = tmp_path / "split"
    workdir.mkdir()
    if args:  # the later cases get past the workdir check
        (workdir / "split.json").write_text("{}")
    args = [str(tmp_path / "apps") if arg == "APPS" else arg for arg in args]
    assert main(["--workdir", str(workdir), *args]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and named in said[0]
