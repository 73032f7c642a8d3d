"""The corpus split (python -m bench.corpus.split --seed SEED): half the rows to tune on, half held
out, drawn once with a seeded numpy permutation and committed before anything is scored.

split.yaml records the seed, the draw and a SHA-256 of corpus.yaml as it stood, so the rows it
split cannot change unseen; every results file records split.yaml's own SHA-256, and
tests/test_bench_corpus.py fails when split.yaml changes after results exist. The draw also
records diag/ as it stood (bench/frozen.py): its held-out half is scored with that diag/ only.
Rows found after the split live in later.yaml, all held out: `--later SEED` draws their one
score, recording later.yaml's SHA-256 beside corpus.yaml's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from bench.corpus.schema import CORPUS, LATER, load_corpus, load_later
from bench.frozen import diag_sha256

SPLIT = Path(__file__).with_name("split.yaml")
DRAWS = Path(__file__).with_name("draws")
"""Later scores of the held-out half (`--redraw SEED`), one file each: the same rows (the corpus
is what it is) on a data seed none scored before, with diag/ as it stood (bench/frozen.py)."""
SETS = ("tuning", "heldout")
DATA_SEEDS = (2, 1000)
"""Where a later draw's data seed is drawn: above the seeds 0 and 1 the baselines' data took."""


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def scored_meta(
    split: Path, commit: str, dirty: bool, start: float, workdir: Path, draw: dict | None = None
) -> dict:
    """What a results file records of how it was scored: when, on which code, against which
    split (its SHA-256: the frozen-split tests compare it), with which diag/ (its SHA-256 as the
    scores are written), the held-out draw it scored (bench.frozen.scored_draw; None for
    tuning), how long, and where the runs are."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "commit": commit,
        "dirty": dirty,
        "split_sha256": sha256(split),
        "diag_sha256": diag_sha256(),
        "draw": draw,
        "wall_seconds": round(time.monotonic() - start, 1),
        "workdir": str(workdir),
        "threads": os.environ.get("OMP_NUM_THREADS"),
    }


LATER_FILE_ROWS = {
    "b5a2e035e780a6a40551a7560223fd19e5fd5a750428b75be48a66584c86b06e": (
        "2e3ba13883a668e9ea3c81431be16d6de276cfab789601f1fada61414859de37"
    )
}
"""Draws made before rows_sha256 existed froze the whole later.yaml (later_sha256): its rows'
content hash as that file held them (batch 1 at 7867940), recorded when batch 2 was appended."""


def drawn_rows_sha256(drawn: dict) -> str | None:
    """The rows' content hash a later draw froze: its own, or its later.yaml's rows'."""
    return drawn.get("rows_sha256") or LATER_FILE_ROWS.get(drawn.get("later_sha256", ""))


def rows_sha256(ids: list[str]) -> str:
    """The SHA-256 of the later rows `ids` as loaded (every field, canonical JSON): what a
    later draw freezes, so that a later batch appended to later.yaml leaves it standing."""
    rows = [row.model_dump() for row in load_later() if row.id in ids]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def write_scores(out: Path, set_name: str, text: str, payload: dict) -> None:
    """A scored set as Markdown (what a reader opens) and JSON (what a later rescore reads)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{set_name}.md").write_text(text)
    (out / f"{set_name}.json").write_text(json.dumps(payload, indent=1, default=str))


def draw(ids: list[str], seed: int) -> dict[str, list[str]]:
    """Ids in corpus order, permuted by the seed; the first half (rounded down) tunes."""
    order = [ids[i] for i in np.random.default_rng(seed).permutation(len(ids))]
    half = len(ids) // 2
    return {
        "tuning": sorted(order[:half], key=ids.index),
        "heldout": sorted(order[half:], key=ids.index),
    }


def load_split(path: Path = SPLIT) -> dict:
    return yaml.safe_load(Path(path).read_text())


def write_redraw(seed: int, why: str, later: bool = False, batch: int | None = None) -> int:
    """A later score of the held-out rows, or (`later`) the first and only score of the rows
    found after the split (later.yaml, all held out): a data seed no earlier draw took, diag/
    as it is. `batch`: only the later rows of that search (schema.Row.batch)."""
    path = DRAWS / f"{seed}.yaml"
    if path.exists():
        print(f"{path} exists: a draw is made once", file=sys.stderr)
        return 2
    later_rows = [row for row in load_later() if batch is None or row.batch == batch]
    rows = [row.id for row in later_rows] if later else load_split()["heldout"]
    if not rows:
        print(f"no rows in {LATER.name}: add the rows found after the split first", file=sys.stderr)
        return 2
    taken = {load_split(p).get("data_seed") for p in DRAWS.glob("*.yaml")}
    free = [s for s in range(*DATA_SEEDS) if s not in taken]
    flag, what = ("--later", "rows found after the split") if later else ("--redraw", "rows")
    header = (
        f"# A later score of the held-out {what}: `python -m bench.corpus.split {flag} {seed}`,\n"
        "# committed before it was scored (python -m bench.corpus --set heldout --draw FILE),\n"
        "# scored once with diag/ as recorded here (bench/frozen.py), on data.seed=data_seed.\n"
    )
    body = {
        "seed": seed,
        "corpus_sha256": sha256(CORPUS),
        **({"later_sha256": sha256(LATER), "rows_sha256": rows_sha256(rows)} if later else {}),
        **({"batch": batch} if later and batch is not None else {}),
        "diag_sha256": diag_sha256(),
        "data_seed": int(np.random.default_rng(seed).choice(free)),
        "why": why,
        "heldout": rows,
    }
    DRAWS.mkdir(exist_ok=True)
    path.write_text(header + yaml.safe_dump(body, sort_keys=False, width=100))
    print(path.read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.corpus.split", description=__doc__)
    chosen = parser.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--seed", type=int, help="draw the split (once)")
    chosen.add_argument("--redraw", type=int, metavar="SEED", help="a later held-out score")
    chosen.add_argument(
        "--later", type=int, metavar="SEED", help="the one score of the rows in later.yaml"
    )
    parser.add_argument("--why", default="", help="what changed since the last score (--redraw)")
    parser.add_argument("--batch", type=int, help="with --later: only the rows of that search")
    args = parser.parse_args(argv)
    if args.redraw is not None:
        return write_redraw(args.redraw, args.why)
    if args.later is not None:
        return write_redraw(args.later, args.why, later=True, batch=args.batch)
    if SPLIT.exists():
        print(f"{SPLIT} exists: the split is drawn once; it is frozen", file=sys.stderr)
        return 2
    ids = [row.id for row in load_corpus().rows]
    sets = draw(ids, args.seed)
    header = (
        f"# Drawn once by `python -m bench.corpus.split --seed {args.seed}` before any scoring or\n"
        "# tuning; frozen (tests/test_bench_corpus.py). corpus_sha256: corpus.yaml as split;\n"
        "# diag_sha256: diag/ as drawn (bench/frozen.py; the held-out half is scored with it).\n"
    )
    body = {"seed": args.seed, "corpus_sha256": sha256(CORPUS), "diag_sha256": diag_sha256()}
    body |= sets
    SPLIT.write_text(header + yaml.safe_dump(body, sort_keys=False))
    print(SPLIT.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
