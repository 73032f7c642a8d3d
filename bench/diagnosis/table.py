"""Totals and rendering of the diagnosis benchmark: one Markdown table, the same as JSON.

Definitions (each total says what it counts over):
- top-1 / top-3: fault scenarios whose true cause (any of its finding ids) ranks first / in the
  first three of `diagnose`'s findings.
- verdict accuracy: scenarios that end right: a fault with a fixing card ends with that card
  confirmed (and no other card confirmed); a fault no card fixes, a control and an A/A scenario
  end with nothing confirmed. Which cards fix a fault (scenarios.yaml's `fix`) is measured on
  seeds the benchmark never uses (truth.py, results/truth.md), not read from its own verdicts.
- false confirmations: confirmed tests among all tests run on controls and A/A pairs.
- strikes to the fix: rejected tests before the fixing card was confirmed, mean over the faults
  where it was.
- early rejection: tokens not trained because a test was stopped early, as a share of the full
  budget (tokens x the seeds planned at the look that stopped it) of the clearly-worse tests:
  those stopped early, those that diverged, and those rejected at full budget more than 5% worse
  than the baseline.
A scenario that ends in an error counts as a wrong verdict, and as a triage miss unless its
baseline's first seed was recorded and could still be diagnosed.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean
from typing import Any

from hyprun.runner import markdown

CLEARLY_WORSE = -0.05
"""A test rejected at full budget with an effect at or below this (5% worse) was clearly worse:
early rejection should have stopped it."""
TARGETS = {"top1": 0.90, "top3": 1.0, "false_confirmation_rate": 0.05, "early_saved_frac": 0.40}


def right_verdict(result: dict[str, Any]) -> bool:
    """Whether the scenario ended as its truth says it should (an error never does)."""
    if result["error"]:
        return False
    confirmed = [t["card"] for t in result["tests"] if t["verdict"] == "confirmed"]
    if result["kind"] == "fault" and result["fix"]:
        return bool(confirmed) and all(c in result["fix"] for c in confirmed)
    return not confirmed


def relabel(document: dict[str, Any], labels: dict[str, tuple[str, ...]], stamp: str) -> None:
    """A recorded run scored against `labels` (scenario: fix list) measured after it ran: the
    verdicts stay as recorded, what counts as right follows the labels; `stamp` says when."""
    for result in document["scenarios"]:
        fix = labels.get(result["name"], tuple(result["fix"]))
        result["fix"] = list(fix)
        for test in result["tests"]:
            test["fixes"] = bool(test.get("card") and test["card"] in fix)
    document["summary"] = summarize(document["scenarios"])
    document["meta"]["relabelled"] = stamp


def clearly_worse(test: dict[str, Any]) -> bool:
    if test["early"]:
        return True
    if test["verdict"] != "rejected":
        return False
    return test["effect"] is None or test["effect"] <= CLEARLY_WORSE


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The benchmark's totals (see the module docstring), with the targets they are held to."""
    ok = results  # an error counts: a wrong verdict, and a miss in triage unless diagnosed
    faults = [r for r in ok if r["kind"] == "fault"]  # undiagnosed: the cause ranks nowhere
    quiet = [r for r in ok if r["kind"] in ("control", "aa")]
    quiet_tests = [t for r in quiet for t in r["tests"]]
    fixed = [r for r in faults if r["fix"] and right_verdict(r) and "strikes_to_confirm" in r]
    worse = [(r, t) for r in ok for t in r["tests"] if clearly_worse(t)]
    worse_budget = sum(r["budget_tokens"] * t.get("look_seeds", r["seeds"]) for r, t in worse)
    decided = [t for r in ok for t in r["tests"] if t["verdict"] in ("confirmed", "rejected")]
    summary = {
        "scenarios": len(results),
        "errors": [r["name"] for r in results if r["error"]],
        "faults": len(faults),
        "top1": _share(sum(r["rank"] == 1 for r in faults), len(faults)),
        "top3": _share(sum(r["rank"] is not None and r["rank"] <= 3 for r in faults), len(faults)),
        "verdict_accuracy": _share(sum(map(right_verdict, ok)), len(ok)),
        "verdicts_right": sum(map(right_verdict, ok)),
        "false_confirmations": sum(t["verdict"] == "confirmed" for t in quiet_tests),
        "quiet_tests": len(quiet_tests),
        "false_confirmation_rate": _share(
            sum(t["verdict"] == "confirmed" for t in quiet_tests), len(quiet_tests)
        ),
        "controls_with_findings": [r["name"] for r in quiet if r["findings"]],
        "mean_strikes_to_fix": fmean(r["strikes_to_confirm"] for r in fixed) if fixed else None,
        "fixed": len(fixed),
        "fixable": sum(bool(r["fix"]) for r in faults),
        "tokens_spent": sum(r["tokens_spent"] for r in ok),
        "tokens_saved": sum(r["tokens_saved"] for r in ok),
        "clearly_worse_tests": len(worse),
        "early_saved_frac": _share(sum(t["tokens_saved"] for _, t in worse), worse_budget),
        "decided_tests": len(decided),
        "seeds_per_decided_test": fmean(t.get("seeds", 0) for t in decided) if decided else None,
        "tokens_per_decided_test": fmean(t["tokens_spent"] for t in decided) if decided else None,
        "fixes_rejected_early": sum(t["fixes"] and t["early"] for r in ok for t in r["tests"]),
        "fixes_rejected": sum(
            t["fixes"] and t["verdict"] == "rejected" for r in ok for t in r["tests"]
        ),
    }
    summary["targets"] = targets(summary)
    return summary


def targets(s: dict[str, Any]) -> dict[str, bool | None]:
    """Met (True), missed (False) or not measured (None), per target."""

    def at_least(value: float | None, target: float) -> bool | None:
        return None if value is None else value >= target - 1e-9

    early = at_least(s["early_saved_frac"], TARGETS["early_saved_frac"])
    fcr = s["false_confirmation_rate"]
    return {
        "top1 >= 90%": at_least(s["top1"], TARGETS["top1"]),
        "top3 = 100%": at_least(s["top3"], TARGETS["top3"]),
        "false confirmations <= 5%": None
        if fcr is None
        else fcr <= TARGETS["false_confirmation_rate"],
        "early rejection saves >= 40%, no true fix rejected early": None
        if early is None
        else early and s["fixes_rejected_early"] == 0,
    }


def render_markdown(
    results: list[dict[str, Any]], summary: dict[str, Any], meta: dict[str, Any]
) -> str:
    """The table, the totals and the targets, as Markdown."""
    lines = [
        f"Diagnosis benchmark, {meta['date']}, commit {meta['commit'][:10]}"
        + (" (dirty)" if meta.get("dirty") else "")
        + f": {summary['scenarios']} scenarios, seeds {meta['seeds']} "
        f"(verdicts {meta.get('rule', 'sequential to the cap')}), "
        f"{meta['jobs']} at a time on {meta['cpus']} CPUs, {meta['wall_seconds'] / 60:.1f} min."
        + (f" Scored against the labels of {meta['relabelled']}." if "relabelled" in meta else ""),
        "",
    ]
    head = ["scenario", "true cause", "rank", "findings (top 3)", "verdicts in order", "strikes"]
    lines += markdown.table([*head, "tokens", "time"], [_row(r) for r in results])
    s = summary
    lines += [
        "",
        f"- triage: top-1 {_pct(s['top1'])}, top-3 {_pct(s['top3'])} of {s['faults']} faults",
        f"- verdict accuracy: {_pct(s['verdict_accuracy'])} ({s['verdicts_right']} of "
        f"{s['scenarios']} scenarios end right; {s['fixed']} of "
        f"{s['fixable']} fixable faults fixed)",
        f"- false confirmations on controls and A/A pairs: {s['false_confirmations']} of "
        f"{s['quiet_tests']} tests ({_pct(s['false_confirmation_rate'])}); controls with a "
        f"finding: {', '.join(s['controls_with_findings']) or 'none'}",
        f"- mean strikes to the fix: {_num(s['mean_strikes_to_fix'])}",
        f"- tokens: {_k(s['tokens_spent'])} spent, {_k(s['tokens_saved'])} saved by early "
        f"rejection = {_pct(s['early_saved_frac'])} of the budget of {s['clearly_worse_tests']} "
        f"clearly-worse tests; true fixes rejected early: {s['fixes_rejected_early']} "
        f"(rejected at all: {s['fixes_rejected']})",
        f"- per decided test ({s['decided_tests']}): {_num(s['seeds_per_decided_test'])} seeds, "
        f"{_k(s['tokens_per_decided_test'] or 0)} tokens",
    ]
    if s["errors"]:
        lines.append(f"- errors: {', '.join(s['errors'])}")
    lines += ["", "| target | met |", "| --- | --- |"]
    for target, met in s["targets"].items():
        lines.append(f"| {target} | {'n/a' if met is None else ('yes' if met else 'NO')} |")
    return "\n".join(lines) + "\n"


def write(
    out: Path, results: list[dict[str, Any]], summary: dict[str, Any], meta: dict[str, Any]
) -> None:
    """latest.md and latest.json in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.md").write_text(render_markdown(results, summary, meta))
    document = {"meta": meta, "summary": summary, "scenarios": results}
    (out / "latest.json").write_text(json.dumps(document, indent=1, default=str) + "\n")


def _row(r: dict[str, Any]) -> list[str]:
    """One scenario's table row."""
    rank = str(r["rank"]) if r["rank"] else ("—" if r.get("diagnosed") else "n/a")
    if r["kind"] != "fault":
        rank = "(control)" if not r["findings"] else "(false alarm)"
    return [
        r["name"],
        f"{r['fault']}{_ids(r['cause'])}",
        rank,
        ", ".join(r["findings"][:3]) or "none",
        _verdicts(r),
        str(r["strikes"]),
        _k(r["tokens_spent"]),
        f"{r['seconds']:.0f} s",
    ]


def _verdicts(r: dict[str, Any]) -> str:
    parts = [f"error: {r['error'][:120]}"] if r["error"] else []
    for t in r["tests"]:
        what = t["card"] or " ".join(t["delta"])
        how = t["verdict"] + (" early" if t["early"] else "")
        effect = f" {t['shown']}" if t.get("shown") else ""
        seeds = f" ({t['seeds']} seeds)" if t.get("seeds") else ""
        parts.append(f"{what}: {how}{effect}{seeds}")
    if r["escalated"]:
        parts.append("escalated")
    return "; ".join(parts) or "no tests"


def _ids(ids: list[str]) -> str:
    return f" (`{'`, `'.join(ids)}`)" if ids else ""


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _k(tokens: int) -> str:
    return f"{tokens / 1000:.0f}k"
