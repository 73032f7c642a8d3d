"""Triage on partial evidence (a run recorded by the probe API, probes off): rows that need a
feature the run lacks are skipped and listed with the evidence they need, never guessed."""

from __future__ import annotations

from hyprun.diag.features import NEEDS, evidence_for, features
from hyprun.diag.triage import holds, load_tables, triage
from tests.test_triage import drop_probes, healthy


def test_every_feature_a_table_reads_has_its_evidence_named():
    named = {f for names in NEEDS.values() for f in names.split()}
    read = {c.feature for row in load_tables() for c in row.conditions()}
    unnamed = {f for f in read if not f.startswith("static.") and f not in named}
    assert unnamed <= {"nan_module", "nan_at_first_step", "static_fail_count", "on_cpu"}, unnamed


def test_a_complete_run_leaves_nothing_unjudged_for_lack_of_probes():
    document = triage(healthy()).to_dict()
    needs = set(document["missing_evidence"])
    assert not {n for n in needs if n.startswith(("grad/", "param/", "act/"))}, needs


def test_rows_without_their_probe_are_listed_with_the_missing_metric():
    evidence = healthy()
    flat = [
        (step, 5.0 + 0.001 * (i % 3)) for i, (step, _) in enumerate(evidence.points("train/loss"))
    ]
    evidence.series["train/loss"] = flat  # a plateau: the LR rows would read the probes
    drop_probes(evidence)
    diagnosis = triage(evidence)
    skipped = {row["id"]: row for row in diagnosis.not_judged}
    fired = {f.id for f in diagnosis.findings}
    measured = features(evidence)
    assert skipped and not fired & set(skipped)
    for row in skipped.values():
        assert all(f not in measured for f in row["missing"]), row
        assert row["needs"] == sorted({evidence_for(f) for f in row["missing"]})
    by_need = diagnosis.to_dict()["missing_evidence"]
    assert "param/update_ratio" in by_need and "grad/norm" in by_need
    # Listed only when nothing measured rules the row out: every condition it can read holds.
    tables = {row.id: row for row in load_tables()}
    for row_id, row in skipped.items():
        readable = [c for c in tables[row_id].when if c.feature not in row["missing"]]
        assert all(holds(c, measured) for c in readable), row_id


def test_a_measured_none_is_an_answer_not_a_gap():
    """No NaN module recorded is the NaN check's answer: nan_in_module is ruled out."""
    document = triage(healthy()).to_dict()
    assert "nan_in_module" not in {row["id"] for row in document["not_judged"]}
