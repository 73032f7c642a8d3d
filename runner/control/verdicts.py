"""A test's verdict: decided at matched tokens from its seed runs' histories, then written on its
run (tags, the metrics the runs table sorts by, a name that says the outcome); `error` where its
jobs gave no evidence. The verdict that takes the last strike escalates."""

from __future__ import annotations

import json
import math
from typing import Any

from rich.markup import escape

from hyprun.diag.effect import change, describe, metric_key
from hyprun.diag.live_checks import read_l0_tags
from hyprun.diag.metric import MetricSpec
from hyprun.diag.rules import static_table
from hyprun.diag.sequential import Design
from hyprun.diag.triage import flattering_row_ids, flattering_rows_fired
from hyprun.diag.verdict import compare
from hyprun.runner.compose import one_line
from hyprun.runner.control.context import DEFAULT_PRIMARY, Outcome, console
from hyprun.runner.control.diagnose import read_evidence
from hyprun.runner.control.early import seed_curves
from hyprun.runner.control.escalation import escalate
from hyprun.runner.control.standing import settle
from hyprun.runner.job.result import JobResult
from hyprun.runner.store.investigation import ARM, State, Store


def decide(
    store: Store,
    state: State,
    results: list[JobResult],
    primary: MetricSpec,
    guards: list[MetricSpec],
    looks: int = 1,
    baseline_runs: list[str] | None = None,
    design: Design | None = None,
) -> dict[str, Any]:
    """The verdict at matched tokens, from the seed runs' histories in MLflow; `looks`: the
    test is the best of that many (a sweep); `baseline_runs`: the baseline seeds of this look
    (default: those recorded with the baseline); `design`: the test's sequential design."""
    metrics = [primary, *guards]
    baseline_runs = baseline_runs or state.baseline["seed_runs"]
    base = {m.metric: seed_curves(store, baseline_runs, m.metric) for m in metrics}
    test_runs = [r.run_id for r in results]
    ours = {m.metric: seed_curves(store, test_runs, m.metric) for m in metrics}
    diverged = any(r.status == "diverged" for r in results)
    diverged_early(store, results, ours[primary.metric])
    blown = [
        int(run.data.tags.get("hyprun.seed", "0"))
        for run in map(store.run, baseline_runs)
        if run.data.tags.get("hyprun.outcome") == "diverged"
    ]
    verdict = compare(
        base[primary.metric],
        ours[primary.metric],
        primary,
        guards=guards,
        baseline_guards=base,
        test_guards=ours,
        diverged=diverged,
        baseline_diverged=blown,
        looks=looks,
        design=design,
        unit=state.unit,
    )
    return verdict.to_dict()


def leaks_removed(store: Store, baseline_runs: list[str], test_runs: list[str]) -> list[str]:
    """The leaks every baseline seed showed and every seed of the test is free of: the L0
    checks whose violation flatters the loss (static.yaml, flatters_loss) failed in each
    baseline seed and pass in each test seed, and the table rows marked flatters_loss (a wrong
    eval normaliser) fired in each baseline seed and in no test seed."""
    leaks = {name for name, rule in static_table()["checks"].items() if rule.get("flatters_loss")}
    rows = flattering_row_ids()

    def statuses(run_id: str) -> dict[str, str]:
        checks = read_l0_tags(store.run(run_id).data.tags)
        found = {check["id"]: check["status"] for check in checks if check["id"] in leaks}
        fired = flattering_rows_fired(read_evidence(store.uri, run_id)[0]) if rows else set()
        return found | {row: "fail" if row in fired else "pass" for row in rows}

    before, after = [statuses(r) for r in baseline_runs], [statuses(r) for r in test_runs]
    if not before or not after:
        return []
    return sorted(
        leak
        for leak in leaks | rows
        if all(seed.get(leak) == "fail" for seed in before)
        and all(seed.get(leak) == "pass" for seed in after)
    )


def leak_fixed(verdict: dict[str, Any], removed: list[str]) -> dict[str, Any]:
    """A test that removed a leak is its fix, confirmed whatever its metric did: the loss the
    leak flattered was never the model's, so a worse one after it is the truth, not a strike."""
    if not removed or verdict["status"] == "confirmed":
        return verdict
    reason = (
        f"removes a leak: {', '.join(removed)} failed in every baseline seed and holds in every "
        f"seed of the test; the metric ({verdict['status']}: {verdict['reason']}) now reads "
        "the model without it"
    )
    return {**verdict, "status": "confirmed", "reason": reason, "leaks_removed": removed}


def diverged_early(
    store: Store, results: list[JobResult], curves: dict[int, list[tuple[int, float]]]
) -> None:
    """A seed that diverged before its first evaluation has no point to compare; its job
    recorded the token count where the loss became NaN/inf. That mark goes in as NaN, so the
    verdict is `rejected — diverged` (a failed fix, a strike), not an error."""
    for result in results:
        if result.status != "diverged":
            continue
        seed = int(store.run(result.run_id).data.tags.get("hyprun.seed", "0"))
        points = curves.get(seed, [])
        if not any(math.isfinite(value) for _, value in points):
            curves[seed] = [*points, (result.tokens, math.nan)]


VERDICT_NUMBERS = {  # verdict field -> metric name prefix; the primary metric is the suffix
    "noise": "noise",
    "test_value": "test_mean",
    "test_sigma": "test_std",
    "baseline_value": "baseline_mean",
    "baseline_sigma": "baseline_std",
}


HEADLINE = ("effect", "noise")
"""Metric prefixes logged on every decided test run (NaN where a diverged test has none)."""


def aggregates(verdict: dict[str, Any]) -> dict[str, float]:
    """The verdict's numbers as metrics of the test run, named for what they measure:
    `effect/eval_loss` (relative change, sign as measured: diag/effect.py), `noise/eval_loss`,
    `test_mean/eval_loss`, ... One primary metric per column, so a sort never mixes units.
    Effect and noise are logged on every decided test, NaN where a diverged one has none, so
    the runs table sorted by effect lists every test."""
    key = metric_key(verdict.get("metric") or DEFAULT_PRIMARY.metric)
    found = {}
    for guard in verdict.get("guards") or []:  # a guard's own column: it may have decided
        guard_key = metric_key(guard["metric"])
        found[f"effect/{guard_key}"] = change(
            {"baseline_value": guard.get("baseline"), "test_value": guard.get("test")}
        )
        found[f"noise/{guard_key}"] = guard.get("noise")
    found[f"effect/{key}"] = change(verdict)
    found |= {f"{prefix}/{key}": verdict.get(field) for field, prefix in VERDICT_NUMBERS.items()}
    found["tokens_saved_frac"] = verdict.get("tokens_saved")
    numbers = {
        name: float(value)
        for name, value in found.items()
        if isinstance(value, int | float) and math.isfinite(value)
    }
    return {**{f"{name}/{key}": math.nan for name in HEADLINE}, **numbers}


def rounds_tags(verdict: dict[str, Any]) -> dict[str, str]:
    """How many seeds per side the test's last look planned, how many of its seeds trained (an
    early rejection stops before the rest start) and why it stopped (status and report show
    them: `Test.seeds_shown`)."""
    if "seeds" not in verdict:
        return {}
    return {
        "hyprun.seeds": str(verdict["seeds"]),
        "hyprun.seeds_run": str(verdict.get("seeds_run", verdict["seeds"])),
        "hyprun.stopped": verdict["stopped"],
    }


def spent_tags(verdict: dict[str, Any]) -> dict[str, str]:
    """What the test's own seeds trained, in its metric's unit, and the share of the plan an
    early stop saved (`hyprun.spent`, a column of status)."""
    if "tokens_spent" not in verdict:
        return {}
    text = f"{int(verdict['tokens_spent']):,} {verdict.get('unit') or 'tokens'}"
    if verdict.get("trials"):  # a sweep: the other trials' seeds are in the report's total
        text += " on the best trial"
    saved = verdict.get("tokens_saved")
    if isinstance(saved, float) and saved > 0:
        text += f" ({saved:.0%} saved)"
    return {"hyprun.spent": text}


def run_name(label: str, verdict: dict[str, Any]) -> str:
    """`H1 optim.lr 1e-05→0.001 · confirmed · eval/loss −3.2% ± 0.2%`: the runs table answers
    which fix worked, by how much and against what noise, without a column added."""
    return f"{label} · {verdict['status']} · {describe(verdict)}"


def arm_name(label: str, verdict: dict[str, Any]) -> str:
    """`H1 confirmed`: a test's side in the comparison view, as its charts' legend names it.
    MLflow's legend is two lines tall; short names fit every side in them, where full run names
    took a line each and cut the legend after H1 (the test run's name keeps delta and effect)."""
    return f"{label.split()[0]} {verdict['status']}"


def record_verdict(
    store: Store,
    state: State,
    test_run: str,
    label: str,
    verdict: dict[str, Any],
    extra: dict[str, str],
) -> Outcome:
    """Write a test's verdict on its run, update the investigation, escalate on the last strike."""
    verdict = {**verdict, "unit": state.unit}  # what its `tokens` count: an app's may be steps
    store.tag(
        test_run,
        {
            "hyprun.verdict": verdict["status"],
            "hyprun.strike": str(verdict["status"] == "rejected").lower(),
            "hyprun.reason": verdict["reason"],
            "hyprun.effect": describe(verdict),
            "hyprun.early": str(bool(verdict.get("early"))).lower(),
            **rounds_tags(verdict),
            **spent_tags(verdict),
            **extra,
        },
    )
    store.metrics(test_run, aggregates(verdict), step=verdict.get("tokens") or 0)
    shown = {**verdict, "change": change(verdict), "shown": describe(verdict)}
    store.text(test_run, json.dumps(shown, indent=2, default=str), "verdict.json")
    store.rename(test_run, run_name(label, verdict))
    for seed_run in store.seed_runs(test_run):  # the seed band is labelled with the outcome
        store.tag(seed_run.info.run_id, {ARM: arm_name(label, verdict)})
    store.finish(test_run)
    state = settle(store, state)
    console.print(escape(f"{run_name(label, verdict)} — {verdict['reason']}"))
    if verdict["status"] == "confirmed":
        number = label.split()[0]
        console.print(
            f"{number} ends the run of failed fixes; make it the baseline with "
            f"'hyprun verify {number} --promote'"
        )
    if state.escalated:
        escalate(store, state)
    return Outcome(0, label.split()[0], verdict)


def record_error(store: Store, test_run: str, label: str, error: BaseException) -> Outcome:
    """Jobs that failed are no evidence: the test ends as `error`, not a strike."""
    store.tag(test_run, {"hyprun.verdict": "error", "hyprun.reason": str(error)[:4000]})
    store.rename(test_run, f"{label} · error")
    store.finish(test_run, "FAILED")
    parent = store.run(store.run(test_run).data.tags["mlflow.parentRunId"])
    settle(store, store.state(parent))
    console.print(escape(f"{label}: error ({one_line(error)}); not a strike"))
    return Outcome(1, label.split()[0], {"status": "error"})
