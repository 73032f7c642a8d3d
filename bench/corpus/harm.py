"""What each corpus bug does at this scale, and which cards remove it (python -m bench.corpus.harm).

Per row: the fault and its clean twin on seeds 0 and 1 (final held-out loss); then every card
that applies to the fault's config (cards.py) on seed 0. A card removes the fault when the row
is harmful (the fault ends >= 2% above the twin) and the card's run ends within 2% of the
twin's (seed 0). One seed per card is a screen, not a verdict (truth.py in bench/diagnosis
uses 6 and a rank test); the rows' `fix_cards` are taken from it before the split and frozen
with the rows. Writes results/harm.json and prints each row; --write puts both into corpus.yaml.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from statistics import mean

from bench.corpus import compose
from bench.corpus.cards import applicable
from bench.corpus.schema import CORPUS, all_rows
from bench.corpus.split import SPLIT

RESULTS = Path(__file__).with_name("results")
SEEDS = (0, 1)
HARMFUL = 0.02
"""A fault is harmful when its mean final eval loss is >= 2% above its twin's."""
WITHIN = HARMFUL
"""A card removes the fault when its run is no longer harmful by the same cut (within 2% of
the twin's loss, seed 0): it takes the harm away, not only some of it (an LR 10x lower halves a
copy task's loss and still leaves it 4x the twin's)."""


def final_eval_loss(form: str, overrides: list[str], seed: int) -> float:
    """compose.final_eval_loss, kept in results/runs.json so an interrupted pass resumes; a
    run that diverged (NaN) reads +inf, worse than any finite loss."""
    path = RESULTS / "runs.json"
    runs = json.loads(path.read_text()) if path.exists() else {}
    key = f"{form} {' '.join(overrides)} seed={seed}"
    if key not in runs:
        loss = compose.final_eval_loss(form, overrides, seed)
        runs[key] = round(loss, 4) if math.isfinite(loss) else math.inf
        RESULTS.mkdir(exist_ok=True)
        path.write_text(json.dumps(runs, indent=0))
    return runs[key] if not math.isnan(runs[key]) else math.inf


def measure(only: list[str] | None = None) -> dict:
    """Fault and twin of every row first (the harm figures), then the card screen of the
    harmful rows (not the silent ones: their harm is not a worse loss). Rows found after the
    split (later.yaml) are measured the same way, so a new batch is built blind with this tool."""
    rows = [row for row in all_rows() if not only or row.id in only]
    out: dict = {}
    for row in rows:
        fault = [final_eval_loss(row.form, row.fault_overrides, s) for s in SEEDS]
        twin = [final_eval_loss(row.form, row.twin_overrides, s) for s in SEEDS]
        out[row.id] = {
            "fault": fault,
            "twin": twin,
            "change": round(mean(fault) / mean(twin) - 1, 4),
        }
        print(row.id, json.dumps(out[row.id]), flush=True)
    for row in rows:
        if out[row.id]["change"] < HARMFUL or row.silent:  # silent: the harm is not a loss
            continue
        fault, twin = out[row.id]["fault"][0], out[row.id]["twin"][0]
        cards = {}
        for card, overrides in applicable(row.form, row.fault_overrides).items():
            loss = final_eval_loss(row.form, [*row.fault_overrides, *overrides], SEEDS[0])
            cards[card] = {"overrides": overrides, "eval_loss": loss}
        out[row.id]["cards"] = cards
        out[row.id]["fix_cards"] = [
            c for c, r in cards.items() if r["eval_loss"] <= twin * (1 + WITHIN) < fault
        ]
        print(row.id, json.dumps(out[row.id]), flush=True)
    return out


def write_rows(results: dict, path: Path = CORPUS) -> None:
    """Each measured row's `harm` and `fix_cards` written into corpus.yaml in place (the rest of
    the file, comments included, untouched); only before the split (split.py freezes it)."""
    lines = path.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("  - id: ")]
    for start, end in reversed(list(zip(starts, [*starts[1:], len(lines)], strict=True))):
        row_id = lines[start].removeprefix("  - id: ").strip()
        if row_id not in results:
            continue
        r = results[row_id]
        block = [
            ln for ln in lines[start:end] if not ln.startswith(("    harm:", "    fix_cards:"))
        ]
        change = r["change"] if math.isfinite(r["change"]) else ".inf"
        fault = ", ".join(str(v) if math.isfinite(v) else ".inf" for v in r["fault"])
        block += [
            f"    fix_cards: [{', '.join(r.get('fix_cards', []))}]",
            f"    harm: {{fault: [{fault}], twin: [{', '.join(map(str, r['twin']))}], "
            f"change: {change}}}",
        ]
        lines[start:end] = block
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.corpus.harm", description=__doc__)
    parser.add_argument("--only", nargs="+", metavar="ID")
    parser.add_argument(
        "--write", action="store_true", help="write harm and fix_cards into corpus.yaml"
    )
    args = parser.parse_args(argv)
    if args.write and SPLIT.exists():
        print("the corpus is split: its rows are frozen (split.yaml)", file=sys.stderr)
        return 2
    results = measure(args.only)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "harm.json"
    previous = json.loads(path.read_text()) if path.exists() and args.only else {}
    merged = {**previous, **results}
    path.write_text(json.dumps(merged, indent=1))
    if args.write:
        write_rows(merged)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
