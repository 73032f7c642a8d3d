"""The app benchmark's split (python -m bench.apps.split --seed SEED), drawn once with a seeded
numpy generator and committed before anything is scored or tuned.

Per (family, form) the magnitudes are permuted: the first half (rounded down) tunes, the rest is
held out, so held-out magnitudes are ones tuning never saw (a one-magnitude family is in both,
on different data). Per form the healthy configs are permuted and split the same way. Every
entry gets a data seed, held-out seeds disjoint from tuning's. split.yaml records the seed and a
SHA-256 of table.yaml as split; results record split.yaml's own; tests/test_bench_apps.py fails
when split.yaml changes after results exist. The draw also records diag/ as it stood
(bench/frozen.py): its held-out set is scored with that diag/ only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import yaml

from bench.apps.schema import TABLE, Entry, Table, load_table
from bench.corpus.split import sha256
from bench.frozen import diag_sha256

SPLIT = Path(__file__).with_name("split.yaml")
DRAWS = Path(__file__).with_name("draws")
"""Later held-out draws (`--redraw SEED`), one file each: the split's held-out set is spent once
scored, and a new one is drawn after the tables change (bench/frozen.py)."""
SETS = ("tuning", "heldout")
SEED_RANGE = (1, 1000)
REDRAW_PER_FAMILY = 2
"""Magnitudes a later draw takes per (family, form): as many as the split held out of four."""


def _halves(items: list, rng: np.random.Generator) -> tuple[list, list]:
    order = [items[i] for i in rng.permutation(len(items))]
    half = len(items) // 2
    return (order[:half], order[half:]) if half else (order, order)


def draw(table: Table, seed: int) -> dict[str, list[dict]]:
    rng = np.random.default_rng(seed)
    sets: dict[str, list[dict]] = {name: [] for name in SETS}
    for family_name, family in table.families.items():
        for form in family.forms:
            for name, half in zip(SETS, _halves(family.magnitudes, rng), strict=True):
                for m in half:
                    entry = {"form": form, "family": family_name, "m": m}
                    sets[name].append({"id": f"{form}/{family_name}@{m:g}", **entry})
    for form in table.forms:
        healthy = [h.id for h in table.healthy if h.form == form]
        for name, half in zip(SETS, _halves(healthy, rng), strict=True):
            sets[name] += [{"id": h, "form": form, "kind": "healthy"} for h in half]
    seeds = rng.choice(np.arange(*SEED_RANGE), size=sum(map(len, sets.values())), replace=False)
    for entry, data_seed in zip([e for n in SETS for e in sets[n]], seeds, strict=True):
        entry["seed"] = int(data_seed)
    return sets


def taken_seeds(paths: list[Path]) -> set[int]:
    """Data seeds the split and every later draw already used."""
    data = [yaml.safe_load(Path(p).read_text()) for p in paths]
    return {e["seed"] for d in data for name in SETS for e in d.get(name, [])}


def unseen_magnitude(low: float, high: float, seen: set[float], rng: np.random.Generator) -> float:
    """A magnitude log-uniform over [low, high] at two significant digits, none in `seen` (the
    table's own, which the split tuned or held out); a one-magnitude family keeps its one."""
    if low == high:
        return low
    while True:
        m = float(f"{np.exp(rng.uniform(np.log(low), np.log(high))):.2g}")
        if m not in seen:
            return m


def redraw(table: Table, seed: int, taken: set[int]) -> list[dict]:
    """A later held-out set: per (family, form) REDRAW_PER_FAMILY magnitudes the table does not
    list, over the family's range; every healthy config (configs seen before, data new); data
    seeds that no earlier draw used."""
    rng = np.random.default_rng(seed)
    entries: list[dict] = []
    for family_name, family in table.families.items():
        low, high, seen = min(family.magnitudes), max(family.magnitudes), set(family.magnitudes)
        for form in family.forms:
            count = REDRAW_PER_FAMILY if low < high else 1
            for _ in range(count):
                m = unseen_magnitude(low, high, seen, rng)
                seen.add(m)
                entry = {"form": form, "family": family_name, "m": m}
                entries.append({"id": f"{form}/{family_name}@{m:g}", **entry})
    entries += [{"id": h.id, "form": h.form, "kind": "healthy"} for h in table.healthy]
    free = np.setdiff1d(np.arange(*SEED_RANGE), sorted(taken))
    for entry, data_seed in zip(
        entries, rng.choice(free, len(entries), replace=False), strict=True
    ):
        entry["seed"] = int(data_seed)
    return entries


def load_split(path: Path = SPLIT) -> dict[str, list[Entry]]:
    """The sets of the split, or of a later draw (which holds a held-out set only)."""
    data = yaml.safe_load(Path(path).read_text())
    return {name: [Entry(**entry) for entry in data.get(name, [])] for name in SETS}


def write_redraw(seed: int) -> int:
    path = DRAWS / f"{seed}.yaml"
    if path.exists():
        print(f"{path} exists: a draw is made once", file=sys.stderr)
        return 2
    earlier = [SPLIT, *sorted(DRAWS.glob("*.yaml"))]
    header = (
        f"# A later held-out draw: `python -m bench.apps.split --redraw {seed}`, committed before\n"
        "# it was scored (python -m bench.apps --set heldout --draw THIS_FILE), scored once, with\n"
        "# diag/ as recorded here (bench/frozen.py). Magnitudes none of the table's; healthy\n"
        "# configs as the table lists them, on new data seeds.\n"
    )
    body = {"seed": seed, "table_sha256": sha256(TABLE), "diag_sha256": diag_sha256()}
    body["heldout"] = redraw(load_table(), seed, taken_seeds(earlier))
    DRAWS.mkdir(exist_ok=True)
    path.write_text(header + yaml.safe_dump(body, sort_keys=False, width=100))
    print(f"{path}: {len(body['heldout'])} entries")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.apps.split", description=__doc__)
    chosen = parser.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--seed", type=int, help="draw the split (once)")
    chosen.add_argument("--redraw", type=int, metavar="SEED", help="a later held-out draw")
    args = parser.parse_args(argv)
    if args.redraw is not None:
        return write_redraw(args.redraw)
    if SPLIT.exists():
        print(f"{SPLIT} exists: the split is drawn once; it is frozen", file=sys.stderr)
        return 2
    sets = draw(load_table(), args.seed)
    header = (
        f"# Drawn once by `python -m bench.apps.split --seed {args.seed}` before any scoring or\n"
        "# tuning; frozen (tests/test_bench_apps.py). table_sha256: table.yaml as split;\n"
        "# diag_sha256: diag/ as drawn (bench/frozen.py; the held-out set is scored with it).\n"
    )
    body = {"seed": args.seed, "table_sha256": sha256(TABLE), "diag_sha256": diag_sha256()}
    body |= sets
    SPLIT.write_text(header + yaml.safe_dump(body, sort_keys=False, width=100))
    print({name: len(entries) for name, entries in sets.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
