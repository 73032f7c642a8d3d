"""`python -m bench.diagnosis.compare FIXED SEQUENTIAL`: two runs of the diagnosis benchmark,
side by side, one with fixed-k verdicts (`--max-seeds 1`) and one sequential (the default).

Reads each folder's latest.json (written by `python -m bench.diagnosis --out DIR`) and prints
per rule: verdict accuracy, fixable faults fixed, false confirmations on controls and A/A pairs
with their exact (Clopper-Pearson) 95% interval, and the seeds and tokens a decided test took;
then, per scenario, the verdicts each rule reached. Writes compare.md beside the sequential
run's table when `--out` is given.

`--relabel` first scores both recorded runs against the labels now in scenarios.yaml (measured
by bench/diagnosis/truth.py after the runs) and rewrites their latest.md and latest.json: the
verdicts are the ones recorded, only what counts as right changes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.diagnosis.table import relabel, right_verdict, write
from hyprun.runner import markdown


def load(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "latest.json").read_text())


def relabel_runs(folders: list[Path]) -> None:
    """Each folder's recorded run scored against scenarios.yaml's labels, rewritten in place."""
    from bench.diagnosis.run import load_scenarios
    from hyprun.runner.provenance import git_state

    labels = {scenario.name: scenario.fix for scenario in load_scenarios()[1]}
    sha, dirty = git_state()
    stamp = f"commit {sha[:10]}{' (dirty)' if dirty else ''}"
    for folder in folders:
        document = load(folder)
        relabel(document, labels, stamp)
        write(folder, document["scenarios"], document["summary"], document["meta"])


def false_confirmations(summary: dict[str, Any]) -> str:
    """`0/9 = 0% (0–34%)`: confirmed tests among the control and A/A tests, exact interval."""
    from scipy import stats  # exact binomial interval: scipy's, not one written here

    false, tests = summary["false_confirmations"], summary["quiet_tests"]
    if not tests:
        return "no tests"
    low, high = stats.binomtest(false, tests).proportion_ci(0.95, method="exact")
    return f"{false}/{tests} = {false / tests:.0%} ({low:.0%}–{high:.0%})"


def rule_row(name: str, run: dict[str, Any]) -> list[str]:
    s, meta = run["summary"], run["meta"]
    seeds = s.get("seeds_per_decided_test")
    tokens = s.get("tokens_per_decided_test")
    return [
        name,
        f"{s['verdict_accuracy']:.0%} ({s['verdicts_right']}/{s['scenarios']})",
        f"{s['fixed']}/{s['fixable']}",
        false_confirmations(s),
        str(s.get("decided_tests", "")),
        f"{seeds:.2f}" if seeds is not None else "",
        f"{tokens / 1000:.0f}k" if tokens is not None else "",
        f"{s['tokens_spent'] / 1e6:.1f}M",
        f"{meta['wall_seconds'] / 60:.1f} min",
    ]


def verdicts(result: dict[str, Any]) -> str:
    """`lr_up_10x confirmed (4)`, `; `-joined: each test's card, verdict and seeds per side."""
    parts = [
        f"{t['card'] or ' '.join(t['delta'])} {t['verdict']}{' early' if t['early'] else ''}"
        f" ({t.get('seeds', '?')})"
        for t in result["tests"]
    ]
    return "; ".join(parts) or "no tests"


def scenario_rows(fixed: dict[str, Any], sequential: dict[str, Any]) -> list[list[str]]:
    by_name = {r["name"]: r for r in fixed["scenarios"]}
    rows = []
    for seq in sequential["scenarios"]:
        old = by_name.get(seq["name"])
        rows.append(
            [
                seq["name"],
                f"{'right' if right_verdict(old) else 'wrong'}: {verdicts(old)}" if old else "",
                f"{'right' if right_verdict(seq) else 'wrong'}: {verdicts(seq)}",
            ]
        )
    return rows


def render(fixed: dict[str, Any], sequential: dict[str, Any]) -> str:
    commits = {run["meta"]["commit"][:10] for run in (fixed, sequential)}
    head = [
        "rule",
        "verdict accuracy",
        "fixable faults fixed",
        "false confirmations (controls, A/A; exact 95% CI)",
        "decided tests",
        "seeds per side per decided test",
        "tokens per decided test",
        "tokens spent",
        "wall",
    ]
    lines = [
        f"Diagnosis benchmark, fixed-k against sequential verdicts (commit "
        f"{', '.join(sorted(commits))}; {fixed['meta']['date']} and {sequential['meta']['date']}; "
        f"seeds to start: {sequential['meta']['seeds']}).",
        "",
        *markdown.table(
            head,
            [
                rule_row("fixed k (the baseline's seeds)", fixed),
                rule_row("sequential (rounds up to the cap)", sequential),
            ],
        ),
        "",
        *markdown.table(
            ["scenario", "fixed k: verdicts (seeds per side)", "sequential"],
            scenario_rows(fixed, sequential),
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.diagnosis.compare", description=__doc__)
    parser.add_argument("fixed", type=Path, help="folder of the fixed-k run's latest.json")
    parser.add_argument("sequential", type=Path, help="folder of the sequential run's latest.json")
    parser.add_argument("--out", type=Path, help="folder to write compare.md in")
    parser.add_argument(
        "--relabel", action="store_true", help="score both runs against scenarios.yaml's labels"
    )
    args = parser.parse_args(argv)
    for folder in (args.fixed, args.sequential):
        if not (folder / "latest.json").is_file():
            print(
                f"no latest.json in {folder}: run 'python -m bench.diagnosis --out {folder}' "
                "first (with --max-seeds 1 for the fixed-k side)",
                file=sys.stderr,
            )
            return 2
    if args.relabel:
        relabel_runs([args.fixed, args.sequential])
    text = render(load(args.fixed), load(args.sequential))
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "compare.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
