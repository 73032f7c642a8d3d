"""The diagnosis benchmark (bench/diagnosis): its scenarios are well-formed truth, and two of them
run end to end through the method (real jobs, real MLflow sqlite), as `python -m bench.diagnosis`
runs all of them outside CI."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate

from bench.diagnosis import compare
from bench.diagnosis.run import load_scenarios, run_scenario
from bench.diagnosis.table import relabel, render_markdown, right_verdict, summarize
from hyprun.diag.triage import TABLES_DIR, load_tables
from hyprun.hypotheses.schema import load_cards
from hyprun.runner.compose import compose

COMMON, SCENARIOS = load_scenarios()
BY_NAME = {s.name: s for s in SCENARIOS}
REQUIRED_FAULTS = {
    "lr_too_high",
    "lr_too_low",
    "post_norm_no_warmup",
    "no_grad_clip",
    "tiny_init",
    "duplicated_data",
    "label_noise",
    "padding_waste",
    "input_bound",
    "attention_collapse",
    "moe_collapse",
    "bf16_numerics",
}
# CI's share of the benchmark: half its token budget, marks every 4096 tokens as in the full run.
CI_COMMON = [o for o in COMMON if not o.startswith("budget.tokens=")] + ["budget.tokens=32768"]


def test_scenarios_cover_the_faults_and_controls():
    faults = {s.name for s in SCENARIOS if s.kind == "fault"}
    assert len(faults) >= 12 and faults >= REQUIRED_FAULTS
    assert any(s.kind == "control" for s in SCENARIOS)
    assert sum(len(s.aa) for s in SCENARIOS if s.kind == "aa") >= 3
    assert len(BY_NAME) == len(SCENARIOS), "scenario names are unique"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario_names_real_findings_and_cards(scenario):
    cards, findings = load_cards(), {p.id for p in load_tables(TABLES_DIR)}
    assert set(scenario.cause) <= findings, f"unknown finding ids: {set(scenario.cause) - findings}"
    assert set(scenario.fix) <= set(cards), f"unknown cards: {set(scenario.fix) - set(cards)}"
    if scenario.kind == "fault":
        assert scenario.plant and scenario.cause
        # The truth is reachable: a finding that names the cause triggers a card that fixes it.
        for card in scenario.fix:
            assert set(cards[card].triggers) & set(scenario.cause), card
    else:
        assert not scenario.plant and not scenario.cause and not scenario.fix
    assert bool(scenario.aa) == (scenario.kind == "aa")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario_configs_compose_and_build(scenario):
    cfg = compose([*COMMON, *scenario.overrides])
    model = instantiate(cfg.model)  # a planted model class imports and builds
    assert sum(p.numel() for p in model.parameters()) > 0
    for delta in scenario.aa:
        compose([*COMMON, *scenario.overrides, delta])


@pytest.mark.slow
def test_two_scenarios_end_to_end(workdir):
    fault, control = BY_NAME["lr_too_low"], BY_NAME["healthy"]
    results = [run_scenario(s, workdir / s.name, 2, CI_COMMON) for s in (fault, control)]
    found, quiet = results
    assert found["error"] is None and quiet["error"] is None, (found["error"], quiet["error"])

    assert found["rank"] is not None and found["rank"] <= 3, found["findings"]
    assert found["confirmed"] in fault.fix, found["tests"]
    assert found["verify"]["test"].startswith("H"), "a confirmed fix is verified, as in the demo"
    assert [t["verdict"] for t in quiet["tests"]].count("confirmed") == 0, quiet["tests"]
    assert all(map(right_verdict, results))
    assert found["tokens_spent"] > quiet["tokens_spent"] > 0
    fix = next(t for t in found["tests"] if t["verdict"] == "confirmed")
    assert fix["effect"] > 0 and fix["shown"].startswith("eval/loss −"), fix  # better: lower

    summary = summarize(results)
    assert summary["top3"] == 1.0 and summary["verdict_accuracy"] == 1.0
    meta = {
        "date": "today",
        "commit": "0" * 40,
        "seeds": 2,
        "jobs": 1,
        "cpus": 2,
        "wall_seconds": 60.0,
    }
    table = render_markdown(results, summary, meta)
    assert "| lr_too_low |" in table and "| healthy |" in table
    assert f"{fix['card']}: confirmed {fix['shown']}" in table

    run = {"meta": {**meta, "rule": "sequential to the cap"}, "summary": summary}
    side_by_side = compare.render({**run, "scenarios": results}, {**run, "scenarios": results})
    rule = next(line for line in side_by_side.splitlines() if line.startswith("| fixed k"))
    quiet_tests = summary["quiet_tests"]
    assert (f"| 0/{quiet_tests} = 0% (" if quiet_tests else "| no tests |") in rule, rule
    assert f"right: {fix['card']} confirmed ({fix['seeds']})" in side_by_side


def test_compare_refuses_a_folder_without_a_run_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert compare.main([str(tmp_path / "none"), str(tmp_path), "--out", str(out)]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("no latest.json in "), said
    assert not out.exists()


def test_a_label_measured_after_a_run_changes_what_counts_as_right_not_the_verdicts():
    document = compare.load(Path(compare.__file__).with_name("results"))  # the recorded run
    verdicts = [[t["verdict"] for t in r["tests"]] for r in document["scenarios"]]
    fault = next(r for r in document["scenarios"] if r["kind"] == "fault" and r.get("confirmed"))
    relabel(document, {fault["name"]: ()}, "labels A")
    wrong = document["summary"]["verdicts_right"]
    relabel(document, {fault["name"]: (fault["confirmed"],)}, "labels B")
    assert document["summary"]["verdicts_right"] == wrong + 1
    assert [[t["verdict"] for t in r["tests"]] for r in document["scenarios"]] == verdicts
    assert document["meta"]["relabelled"] == "labels B"
    assert "Scored against the labels of labels B." in render_markdown(
        document["scenarios"], document["summary"], document["meta"]
    )
