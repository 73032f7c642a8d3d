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
SETS = ("tuning", "heldout")
SEED_RANGE = (1, 1000)


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


def load_split(path: Path = SPLIT) -> dict[str, list[Entry]]:
    data = yaml.safe_load(Path(path).read_text())
    return {name: [Entry(**entry) for entry in data[name]] for name in SETS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.apps.split", description=__doc__)
    parser.add_argument("--seed", type=int, required=True)
    args = parser.parse_args(argv)
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
