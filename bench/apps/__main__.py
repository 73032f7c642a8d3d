"""`python -m bench.apps --set tuning|heldout`: the fault families planted in the HF Trainer,
Lightning and plain-loop apps through hyprun, scored.

Per entry of the set (split.yaml): a 2-seed baseline with the fault planted, `diagnose` of seed
0, top-1/top-3 (a finding naming the true cause ranked first / in the first three); healthy
entries: no finding at all. Strikes to the fix are simulated from the ranking for hyprun's
order, random orders and the classic report's (bench/corpus's simulate). Per form, one clearly
worse test (LR 100x below best) is run for real for early rejection. The held-out set is scored
once: a second run is refused while its results exist, and so is one whose draw recorded
another diag/ than today's, or none (bench/frozen.py); a spent held-out set is followed by a
later draw (`python -m bench.apps.split --redraw SEED`, scored with `--draw draws/SEED.yaml`).
Writes results/SET.json and SET.md (results/heldout-SEED.* for a later draw).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.apps.run import early_rejection, entry_folder, run_entry
from bench.apps.schema import load_table
from bench.apps.split import SETS, SPLIT, load_split
from bench.corpus.__main__ import ORDERS
from bench.corpus.split import scored_meta, write_scores
from bench.frozen import refusal, scored_draw

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).with_name("results")


def share(rows: list[dict], hit) -> str:
    n = sum(bool(hit(r)) for r in rows)
    return f"{n / len(rows):.0%} ({n}/{len(rows)})" if rows else "n/a"


def top(k: int):
    return lambda r: r["rank"] is not None and r["rank"] <= k


def render(set_name: str, results: list[dict], early: list[dict], meta: dict) -> str:
    faults = [r for r in results if r["kind"] == "fault"]
    healthy = [r for r in results if r["kind"] == "healthy"]
    lines = [
        f"# Foreign-app benchmark, {set_name} ({meta['date']}, commit {meta['commit'][:7]}, "
        f"{meta['wall_seconds'] / 60:.1f} min)",
        "",
        f"- top-1 (the first finding names the planted cause): {share(faults, top(1))}",
        f"- top-3: {share(faults, top(3))}",
        f"- healthy app configs with no finding: {share(healthy, lambda r: not r['findings'])}",
        f"- entries that errored: {share(results, lambda r: r['error'])}",
        "",
        "| order (simulated) | mean strikes | fixed within 3 strikes |",
        "| --- | --- | --- |",
    ]
    scored = [r for r in faults if "orders" in r]
    for order in ORDERS:
        strikes = np.mean([r["orders"][order]["strikes"] for r in scored]) if scored else 0
        fixed = np.mean([r["orders"][order]["fixed"] for r in scored]) if scored else 0
        lines.append(f"| {order} | {strikes:.2f} | {fixed:.0%} |")
    lines += ["", "| form | family | top-1 | top-3 |", "| --- | --- | --- | --- |"]
    groups = sorted({(r["form"], r["family"]) for r in faults})
    for form, family in groups:
        rows = [r for r in faults if (r["form"], r["family"]) == (form, family)]
        lines.append(f"| {form} | {family} | {share(rows, top(1))} | {share(rows, top(3))} |")
    lines += [
        "",
        "| early rejection (LR 100x lower) | verdict | early | steps of the test saved | "
        "seeds run (steps each) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for e in early:
        if e["error"]:
            lines.append(f"| {e['form']} {e['delta']} | ERROR {e['error'][:100]} | | | |")
            continue
        saved = "n/a" if e["saved_frac"] is None else f"{e['saved_frac']:.0%}"
        lines.append(
            f"| {e['form']} {e['delta']} | {e['verdict']} | {e['early']} | {saved} | "
            f"{e['seeds_run']} ({', '.join(map(str, e['seed_steps']))}) |"
        )
    lines += ["", "| entry | data seed | findings (ranked) | rank |", "| --- | --- | --- | --- |"]
    for r in results:
        error = f" ERROR {r['error'][:100]}" if r["error"] else ""
        lines.append(
            f"| {r['id']} | {r['seed']} | {', '.join(r['findings'][:4]) or 'none'}{error} | "
            f"{r['rank'] or '-'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.apps", description=__doc__)
    parser.add_argument("--set", choices=SETS, required=True, dest="set_name")
    parser.add_argument("--workdir", help="MLflow files per entry (default: a new temp folder)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--no-early", action="store_true", help="skip the early-rejection runs")
    parser.add_argument(
        "--draw", type=Path, help="a later held-out draw (draws/SEED.yaml) instead of split.yaml's"
    )
    args = parser.parse_args(argv)
    if args.draw and args.set_name != "heldout":
        print("--draw is a held-out draw: use it with --set heldout", file=sys.stderr)
        return 2
    out, split = Path(args.out), args.draw or SPLIT
    if not split.exists():
        print(
            f"no {split}: draw it first (python -m bench.apps.split --redraw SEED)", file=sys.stderr
        )
        return 2
    seed = yaml.safe_load(split.read_text())["seed"]
    name = f"heldout-{seed}" if args.draw else args.set_name  # results/NAME.json and .md
    if args.set_name == "heldout" and (out / f"{name}.json").exists():
        print(f"a held-out draw is scored once: results/{name}.json exists", file=sys.stderr)
        return 2
    draw = None
    if args.set_name == "heldout":
        if why := refusal(split, seed):
            print(why, file=sys.stderr)
            return 2
        draw = scored_draw(split, seed)
    from bench.diagnosis.run import worker_setup
    from hyprun.runner.provenance import git_state

    if str(ROOT) not in sys.path:  # the apps are imported by name from the repository
        sys.path.insert(0, str(ROOT))
    sha, dirty = git_state()
    worker_setup(1, sha)  # a helper's commit mid-run is not a change to the imported code
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hyprun-apps-")).resolve()
    table = load_table()
    rng = np.random.default_rng(26)
    start = time.monotonic()
    results: list[dict[str, Any]] = []
    for entry in load_split(split)[args.set_name]:
        results.append(run_entry(table, entry, entry_folder(workdir, entry.id, entry.seed), rng))
        r = results[-1]
        print(f"{r['id']}: {r['findings'][:3]} rank={r['rank']} {r['seconds']} s", flush=True)
        if r["error"]:
            print(f"  ERROR {r['error'][:300]}", flush=True)
    early = []
    for form in [] if args.no_early else table.forms:
        early.append(early_rejection(table, form, workdir / f"early-{form}"))
        print(early[-1], flush=True)
    meta = scored_meta(split, sha, dirty, start, workdir, draw)
    text = render(name, results, early, meta)
    print(text)
    write_scores(out, name, text, {"meta": meta, "results": results, "early": early})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
