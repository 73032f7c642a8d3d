"""`python -m bench.corpus --set tuning|heldout`: the real-world corpus through hyprun, scored.

Per row of the set: a baseline of the app with the bug on, `diagnose`, tests in hyprun's order
until a fix is confirmed or the third strike (run.py); per distinct clean twin: its baseline and
diagnosis. Scored per row: detected (a top-3 finding names the root cause), fixed (a test
confirmed the code fix or a card in the row's fix_cards), strikes; the same findings' order
beside random and classic-report card orders, simulated as bench/diagnosis/split.py does (a card
in fix_cards, or the code fix, confirms; every other card is a strike). Twins: no finding at all.
The held-out set is scored once: a second run is refused while its results exist, and so is
one whose draw recorded another diag/ than today's, or none (bench/frozen.py). A later score
of the held-out rows (`python -m bench.corpus.split --redraw SEED`: a data seed not scored
before, diag/ as it stands) runs with `--draw draws/SEED.yaml` into results/heldout-SEED.*;
so do the rows found after the split (later.yaml), drawn once with `--later SEED`.
Writes results/SET.json and results/SET.md; MLflow files stay under --workdir.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.corpus.cards import applicable
from bench.corpus.run import CODE_FIX, run_row
from bench.corpus.schema import all_rows
from bench.corpus.split import SETS, SPLIT, load_split, scored_meta, write_scores
from bench.diagnosis.split import CLASSIC_LISTING, SHUFFLES, _strikes
from bench.frozen import refusal, scored_draw

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).with_name("results")
ORDERS = ("hyprun", "random", "classic")


def orders(row, result: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Strikes to the fix under the three orders, simulated from the ranked findings."""
    useful = sorted(applicable(row.form, row.fault_overrides))
    detected = result["rank"] is not None and result["rank"] <= 3
    return simulate(useful, {*row.fix_cards, CODE_FIX}, detected, result["cards"], rng)


def simulate(
    useful: list[str], fix: set[str], detected: bool, found: list[str], rng: np.random.Generator
) -> dict[str, Any]:
    """Strikes to a fix in `fix` when testing the findings' cards (`found`, the code fix first
    where `detected`), the `useful` cards shuffled, or in the classic report's order."""
    from hyprun.hypotheses.schema import load_cards

    cards = load_cards()
    hyprun = [CODE_FIX] * detected + [c for c in found if c in useful]
    classic = sorted(
        (c for c in useful if cards[c].claimed is not None),
        key=lambda c: (
            -float(str(cards[c].claimed.confidence or "0").rstrip("%") or 0),
            CLASSIC_LISTING.index(c) if c in CLASSIC_LISTING else len(CLASSIC_LISTING),
        ),
    )
    shuffled = [_strikes(list(rng.permutation(useful)), fix) for _ in range(SHUFFLES)]
    return {
        "hyprun": _strikes(hyprun, fix),
        "classic": _strikes(classic, fix),
        "random": {k: float(np.mean([s[k] for s in shuffled])) for k in ("strikes", "fixed")},
    }


def score(rows: list, results: dict[str, dict]) -> dict[str, Any]:
    rng = np.random.default_rng(15)
    scored = []
    for row in rows:
        r = results[row.id]
        # a confirmed code fix is recorded by its delta (the switch off), a card by its id
        fixed = r["confirmed"] in {*row.fix_cards, CODE_FIX, f"{row.switch}=false"}
        scored.append(
            {
                "id": row.id,
                "sources": row.sources,
                "harm": row.harm.change if row.harm else None,
                "silent": row.silent,
                "findings": r["findings"],
                "rank": r["rank"],
                "detected": r["rank"] is not None and r["rank"] <= 3,
                "has_knob": bool(row.fix_cards),
                "fixed": fixed,
                "confirmed": r["confirmed"],
                "tests": [(t["card"] or " ".join(t["delta"]), t["verdict"]) for t in r["tests"]],
                "strikes": r.get("strikes", 0),
                "orders": orders(row, r, rng),
                "error": r["error"],
                "seconds": r["seconds"],
            }
        )
    return {"rows": scored}


def share(rows: list[dict], hit) -> str:
    n = sum(bool(hit(r)) for r in rows)
    return f"{n / len(rows):.0%} ({n}/{len(rows)})" if rows else "n/a"


def render(set_name: str, summary: dict[str, Any], twins: list[dict], meta: dict) -> str:
    rows = summary["rows"]
    knob = [r for r in rows if r["has_knob"]]
    quiet = share(twins, lambda t: not t["findings"] and not t["error"])
    detected = share(rows, lambda r: r["detected"])
    lines = [
        f"# Real-world corpus, {set_name} ({meta['date']}, commit {meta['commit'][:7]}, "
        f"{meta['wall_seconds'] / 60:.1f} min)",
        "",
        f"- detected (a top-3 finding names the root cause): {detected}",
        f"- fix confirmed by a test, rows with a knob: {share(knob, lambda r: r['fixed'])}; "
        f"all rows (code fix included): {share(rows, lambda r: r['fixed'])}",
        f"- clean twins with no finding: {quiet}",
        "",
        "| order (simulated) | mean strikes | fixed within 3 strikes |",
        "| --- | --- | --- |",
    ]
    for order in ORDERS:
        strikes = np.mean([r["orders"][order]["strikes"] for r in rows]) if rows else 0
        fixed = np.mean([r["orders"][order]["fixed"] for r in rows]) if rows else 0
        lines.append(f"| {order} | {strikes:.2f} | {fixed:.0%} |")
    lines += [
        "",
        "| row | harm | findings (ranked) | detected | tests (verdict) | fixed | source |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        harm = "-" if r["harm"] is None else f"{r['harm']:+.0%}".replace("+inf%", "diverged")
        tests = ", ".join(f"{c} ({v})" for c, v in r["tests"]) or "none"
        error = f" ERROR {r['error'][:80]}" if r["error"] else ""
        lines.append(
            f"| {r['id']}{' (silent)' if r['silent'] else ''} | {harm} | "
            f"{', '.join(r['findings'][:3]) or 'none'}{error} | "
            f"{'yes' if r['detected'] else 'no'} | "
            f"{tests} | {'yes' if r['fixed'] else 'no'} | {r['sources'][0]} |"
        )
    lines += ["", "| clean twin | findings |", "| --- | --- |"]
    for t in twins:
        error = f" ERROR {t['error'][:80]}" if t["error"] else ""
        lines.append(f"| {t['name']} | {', '.join(t['findings']) or 'none'}{error} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.corpus", description=__doc__)
    parser.add_argument("--set", choices=SETS, required=True, dest="set_name")
    parser.add_argument("--workdir", help="MLflow files per row (default: a new temp folder)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument(
        "--draw", type=Path, help="a later score of the held-out rows (draws/SEED.yaml)"
    )
    args = parser.parse_args(argv)
    if args.draw and args.set_name != "heldout":
        print("--draw is a held-out draw: use it with --set heldout", file=sys.stderr)
        return 2
    split = args.draw or SPLIT
    if not split.exists():
        print(
            f"no {split.name}: draw it first (python -m bench.corpus.split --seed N)",
            file=sys.stderr,
        )
        return 2
    out, drawn = Path(args.out), load_split(split)
    name = f"heldout-{drawn['seed']}" if args.draw else args.set_name  # results/NAME.json, .md
    extra = (f"data.seed={drawn['data_seed']}",) if args.draw else ()
    if args.set_name == "heldout" and (out / f"{name}.json").exists():
        print(f"a held-out draw is scored once: results/{name}.json exists", file=sys.stderr)
        return 2
    draw = None
    if args.set_name == "heldout":
        if why := refusal(split, drawn["seed"]):
            print(why, file=sys.stderr)
            return 2
        draw = scored_draw(split, drawn["seed"])
    from bench.diagnosis.run import worker_setup
    from hyprun.runner.provenance import git_state

    if str(ROOT) not in sys.path:  # the app is imported by name from the rows' folders
        sys.path.insert(0, str(ROOT))
    sha, dirty = git_state()
    worker_setup(1, sha)  # a helper's commit mid-run is not a change to the imported code
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hyprun-corpus-")).resolve()
    by_id = {row.id: row for row in all_rows()}
    rows = [by_id[i] for i in drawn[args.set_name]]
    start = time.monotonic()
    results, twins, seen = {}, [], set()
    for row in rows:
        results[row.id] = run_row(row, workdir / row.id, extra=extra)
        r = results[row.id]
        print(
            f"{row.id}: {r['findings'][:3]} confirmed={r['confirmed']} {r['seconds']} s "
            f"{r['error'] or ''}",
            flush=True,
        )
        if tuple(row.twin_overrides) not in seen:
            seen.add(tuple(row.twin_overrides))
            twin = run_row(row, workdir / f"{row.id}-twin", twin=True, extra=extra)
            twins.append(twin)
            print(
                f"{twin['name']}: {twin['findings']} {twin['seconds']} s {twin['error'] or ''}",
                flush=True,
            )
    summary = score(rows, results)
    meta = scored_meta(split, sha, dirty, start, workdir, draw)
    text = render(name, summary, twins, meta)
    print(text)
    payload = {"meta": meta, "summary": summary, "twins": twins, "results": results}
    write_scores(out, name, text, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
