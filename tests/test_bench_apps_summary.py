"""The app benchmark's summary (bench/apps/summary.py) and the setting's reference
(bench/apps/setting.py): a fault planted at a high LR counts as two faults only where its
setting alone costs more than the plant, the setting's cause is the family that plants that
setting, and the summary recounts the committed results. Fast: reads files, trains nothing."""

from __future__ import annotations

import json

from bench.apps import setting
from bench.apps.schema import Entry, load_table, twin_of
from bench.apps.setting import reference_of
from bench.apps.summary import (
    RESULTS,
    count,
    is_two_faults,
    main,
    render,
    scored_sets,
    setting_causes,
)

TABLE = load_table()


def fault(entry_id: str, family: str, findings: list[str], rank: int | None) -> dict:
    return {"id": entry_id, "kind": "fault", "family": family, "findings": findings, "rank": rank}


def test_two_faults_needs_the_setting_to_cost_more_than_the_plant_and_to_be_harmful():
    assert is_two_faults(0.05, 1.7)
    assert not is_two_faults(1.07, 0.28)  # warmup off at 3.4x the best LR: the plant dominates
    assert not is_two_faults(0.001, 0.015)  # neither harmful
    assert not is_two_faults(0.3, None)  # no setting measured


def test_the_setting_cause_is_the_family_that_plants_the_setting():
    assert setting_causes(TABLE, "no_warmup") == set(TABLE.families["lr_high"].cause)
    assert setting_causes(TABLE, "no_clip") == set(TABLE.families["lr_high"].cause)
    assert setting_causes(TABLE, "lr_low") == set()  # no setting: one fault


def test_an_lr_named_first_counts_only_where_the_setting_is_the_larger_fault():
    rows = [
        fault("hf/no_warmup@12", "no_warmup", ["lr_too_high_config", "static.warmup"], 2),
        fault("hf/no_warmup@3.4", "no_warmup", ["lr_high_with_drift"], None),
        fault("hf/no_warmup@30", "no_warmup", ["static.warmup"], 1),
        fault("loop/no_clip@21", "no_clip", ["lr_too_high_config"], None),  # no plant harm
        {"id": "hf_default", "kind": "healthy", "findings": []},
        {"id": "hf_other", "kind": "healthy", "findings": ["steps_too_short"]},
    ]
    harm = {"hf/no_warmup@12": 0.1, "hf/no_warmup@3.4": 1.07, "loop/no_clip@21": -0.01}
    setting = {"hf/no_warmup@12": 2.6, "hf/no_warmup@3.4": 0.28, "loop/no_clip@21": 1.9}
    counts = count(TABLE, rows, harm, setting)
    assert (counts.faults, counts.top1) == (4, 1)
    assert counts.unmeasured == ["hf/no_warmup@30"]
    assert (counts.harmful, counts.harmful_top1, counts.harmful_top3) == (2, 0, 1)
    assert (counts.two_faults, counts.harmful_top1_two) == (1, 1)
    assert (counts.healthy, counts.healthy_quiet) == (2, 1)


def test_the_reference_is_the_twin_at_magnitude_one():
    entry = Entry(id="hf/no_warmup@12", form="hf", family="no_warmup", m=12.0, seed=5)
    lr_key = TABLE.forms["hf"].keys["lr"]
    best = TABLE.forms["hf"].best_lr
    assert f"{lr_key}={best * 12:.4g}" in twin_of(TABLE, entry)
    assert reference_of(TABLE, entry) == [*TABLE.forms["hf"].base, f"{lr_key}={best:.4g}"]


def test_the_summary_recounts_every_committed_set(capsys):
    sets = scored_sets()
    assert sets[0] == ("tuning", "tuning") and sets[1] == ("held-out draw 1", "heldout")
    lines = {row.split(" | ")[0]: row for row in render().splitlines()}
    for label, name in sets:
        results = json.loads((RESULTS / f"{name}.json").read_text())["results"]
        faults = [r for r in results if r["kind"] == "fault"]
        strict = sum(r["rank"] == 1 for r in faults)
        assert f"| {strict / len(faults):.0%} ({strict}/{len(faults)}) |" in lines[f"| {label}"]
    assert main(["--pool-from", "0"]) == 2
    assert "--pool-from" in capsys.readouterr().out
    assert main(["--pool-from", "8"]) == 0
    assert "held-out draws 8+ pooled" in capsys.readouterr().out


def test_the_setting_is_measured_only_beside_a_recorded_harm(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(setting, "RESULTS", tmp_path)  # no harm file there
    argv = ["--set", "heldout", "--workdir", str(tmp_path / "runs")]
    assert setting.main(argv) == 2
    assert "run bench.apps.harm" in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == []
