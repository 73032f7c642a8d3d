"""What one cut shared by every row would detect, on recorded runs:

    python -m bench.shared_cut --workdir DIR [--apps DIR] [--z Z ...] [--detail]

Issue 27 asks that each feature be scored against the healthy reference and that all rows cut
at one place, instead of each row at a threshold of its own (`python -m bench.margins`: 0.025x
to 4430x past the healthy extreme). This measures that before anything in diag/ changes. The
common scale is the healthy z-score: Z healthy standard deviations past the healthy mean on the
cut's side (diag/tables/healthy_reference.yaml), in log space where every healthy value is
positive, since ratios and norms spread over decades. For each Z, every ordering cut of a Q1/Q2
row on a feature the reference measures moves there, in a copy of the tables; every recorded
run in DIR (a `python -m bench.diagnosis.split --set healthy tuning --workdir DIR` run) is
triaged with that copy, and so are the apps' tuning runs (`--apps`: a `python -m bench.apps
--set tuning` workdir). The planted faults' top-1 and top-3 (harmful ones; `--sets`) and the
healthy runs with no finding are printed beside the tables as they are. A cut on a feature
with fewer than MIN_RUNS healthy values, or none spread (every healthy value equal), keeps its
own threshold.

In-sample on both sides: the reference is built from these healthy runs, and a Z picked here is
picked on the tuning set; only a held-out draw frozen after the change can score it.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.diagnosis.split import HARM, harmful, load_split, name_of, reference_of
from bench.margins import ABOVE
from hyprun.diag.evidence import Evidence
from hyprun.diag.reference import Reference, load_reference
from hyprun.diag.triage import ORDERING, TABLES_DIR, cause_rank, load_tables, triage

MIN_RUNS = 8
"""Fewer healthy values than this give no spread to score against."""
APPS_RESULTS = Path(__file__).parent / "apps" / "results"


def shared_threshold(values: list[float], op: str, z: float) -> float | None:
    """The value Z healthy standard deviations past the healthy mean on the side `op` cuts
    (above for > and >=), in log space when every healthy value is positive; None when the
    healthy values cannot be scored against (too few, or no spread)."""
    if len(values) < MIN_RUNS:
        return None
    logged = all(value > 0 for value in values)
    scale = np.log(values) if logged else np.asarray(values, dtype=float)
    spread = float(np.std(scale, ddof=1))
    if spread == 0 or not math.isfinite(spread):
        return None
    side = 1 if op in ABOVE else -1
    cut = float(np.mean(scale)) + side * z * spread
    return float(f"{math.exp(cut) if logged else cut:.4g}")


def move_cuts(
    rows: list[dict[str, Any]], reference: Reference, z: float, only: set[str] | None = None
) -> dict[str, int]:
    """Move every ordering cut of the Q1/Q2 rows (`when` and each `when_any` group; of the rows
    in `only` when given) to the shared threshold, in place; counts of the cuts moved and of
    those kept."""
    counts = {"moved": 0, "kept": 0}
    for row in rows:
        if row.get("question") not in ("Q1", "Q2") or (only and row["id"] not in only):
            continue
        groups = [row.get("when", []), *row.get("when_any", [])]
        for condition in (c for group in groups for c in group):
            if condition.get("field", "value") != "value" or condition["op"] not in ORDERING:
                continue
            values = reference.values(condition["feature"])
            if not values:
                continue
            threshold = shared_threshold(values, condition["op"], z)
            if threshold is None:
                counts["kept"] += 1
                continue
            condition["threshold"] = threshold
            counts["moved"] += 1
    return counts


def write_tables(
    folder: Path, z: float | None, reference: Reference, only: set[str] | None = None
) -> dict[str, int]:
    """diag/tables copied into `folder`, with the cuts (of the rows in `only`, when given)
    moved to Z (None: as they are)."""
    counts = {"moved": 0, "kept": 0}
    for path in sorted(TABLES_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if z is None or not isinstance(data, dict) or "patterns" not in data:
            shutil.copy(path, folder / path.name)
            continue
        for key, value in move_cuts(data["patterns"], reference, z, only).items():
            counts[key] += value
        (folder / path.name).write_text(yaml.safe_dump(data, sort_keys=False))
    return counts


@dataclass
class Case:
    """A recorded run to triage again: a planted fault (its cause rows) or a healthy run."""

    evidence: Evidence
    cause: tuple[str, ...] = ()
    """The rows that name the planted cause; empty for a healthy run."""
    harmful: bool = True
    """Whether the fault did harm at the benchmark's budget (only harmful faults are scored)."""


def gpt_cases(workdir: Path, sets: list[str]) -> dict[str, Case]:
    """The planted faults of `sets` and the healthy runs recorded in a split run's workdir."""
    from hyprun.runner.control.diagnose import read_evidence

    results: dict[str, dict] = json.loads((workdir / "split.json").read_text())
    uri = f"sqlite:///{workdir}/mlflow.db"
    split = load_split()
    cases = {}
    for item in (item for name in ["healthy", *sets] for item in split[name]):
        result = results.get(name_of(item), {})
        if not result.get("run_id"):
            continue
        evidence = read_evidence(uri, result["run_id"])[0]
        if "family" not in item:
            cases[name_of(item)] = Case(evidence)
            continue
        healthy = reference_of(item, split["healthy"])
        hurt = harmful(result, results.get(name_of(healthy)) if healthy else None)
        cases[name_of(item)] = Case(evidence, tuple(result["cause"]), hurt)
    return cases


def app_cases(workdir: Path) -> dict[str, Case]:
    """The apps' tuning set recorded in a `python -m bench.apps --set tuning` workdir: seed 0
    of each baseline, as the benchmark diagnoses it; harm from results/harm_tuning.json."""
    from bench.apps.run import EXPERIMENT, entry_folder, investigation_name
    from bench.apps.schema import load_table
    from bench.apps.split import load_split as load_apps_split
    from hyprun.runner.control.diagnose import read_evidence
    from hyprun.runner.store.investigation import Store

    table = load_table()
    harm = json.loads((APPS_RESULTS / "harm_tuning.json").read_text())
    change = {row["id"]: row["change"] for row in harm["rows"]}
    cases = {}
    for entry in load_apps_split()["tuning"]:
        folder = entry_folder(workdir, entry.id, entry.seed)
        store = Store(f"sqlite:///{folder}/mlflow.db", EXPERIMENT)
        state = store.find(investigation_name(entry.id))
        evidence = read_evidence(store.uri, state.baseline["seed_runs"][0])[0]
        if entry.kind == "healthy":
            cases[f"apps/{entry.id}"] = Case(evidence)
            continue
        cause = tuple(table.families[entry.family].cause)
        cases[f"apps/{entry.id}"] = Case(evidence, cause, change.get(entry.id, 1.0) > HARM)
    return cases


def score(cases: dict[str, Case], tables: Path) -> dict[str, dict]:
    """With every case triaged by the tables in `tables`: the harmful faults named first and
    in the top 3 and the healthy runs with no finding, and per run the fault's rank (`ranks`)
    or the healthy run's findings (`alarms`)."""
    ranks: dict[str, int | None] = {}
    alarms: dict[str, list[str]] = {}
    for name, case in cases.items():
        findings = [f.to_dict() for f in triage(case.evidence, tables).findings]
        if not case.cause:
            alarms[name] = [f["id"] for f in findings]
        elif case.harmful:
            ranks[name] = cause_rank(findings, case.cause)
    return {
        "faults": {
            "top1": sum(rank == 1 for rank in ranks.values()),
            "top3": sum(rank is not None and rank <= 3 for rank in ranks.values()),
            "of": len(ranks),
        },
        "healthy": {"quiet": sum(not ids for ids in alarms.values()), "of": len(alarms)},
        "ranks": ranks,
        "alarms": alarms,
    }


def changes(own: dict[str, dict], shared: dict[str, dict]) -> list[str]:
    """What the shared cut changes against the rows' own: faults whose rank moved, and
    healthy runs with a finding."""
    moved = [
        f"  {name}: rank {own['ranks'][name]} -> {rank}"
        for name, rank in shared["ranks"].items()
        if rank != own["ranks"].get(name)
    ]
    return moved + [f"  {name} (healthy): {ids}" for name, ids in shared["alarms"].items() if ids]


def refusal(workdir: Path, apps: Path | None, rows: list[str] | None) -> str | None:
    """One line naming what is wrong with the arguments, before anything is read; or None."""
    if not (workdir / "split.json").exists():
        return (
            f"--workdir {workdir} holds no split.json: name a bench.diagnosis.split run's workdir"
        )
    if apps is not None and not (apps / "mlflow.db").exists() and not any(apps.glob("*/mlflow.db")):
        return f"--apps {apps} holds no recorded app runs: name a bench.apps --set tuning workdir"
    unknown = sorted(set(rows or ()) - {row.id for row in load_tables()})
    if unknown:
        return f"--rows names no table row {unknown}: use row ids from diag/tables/*.yaml"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a split run's workdir")
    parser.add_argument("--apps", type=Path, help="an apps tuning run's workdir, scored too")
    parser.add_argument("--z", type=float, nargs="+", default=[1.5, 2.0, 2.5, 3.0, 4.0])
    parser.add_argument(
        "--sets", nargs="+", default=["tuning"], help="fault sets to score (a spent draw: heldout)"
    )
    parser.add_argument("--detail", action="store_true", help="list what each Z changes")
    parser.add_argument("--rows", nargs="+", help="move only these rows' cuts (one rule's change)")
    args = parser.parse_args(argv)
    if why := refusal(args.workdir, args.apps, args.rows):
        print(why, file=sys.stderr)
        return 2
    reference = load_reference()
    cases = gpt_cases(args.workdir, args.sets) | (app_cases(args.apps) if args.apps else {})
    print("| cuts | moved / kept | harmful faults first | in the top 3 | healthy quiet |")
    print("| --- | --- | --- | --- | --- |")
    own, details = None, []
    for z in [None, *args.z]:
        with tempfile.TemporaryDirectory() as folder:
            counts = write_tables(Path(folder), z, reference, set(args.rows or ()))
            found = score(cases, Path(folder))
        own = own or found
        details += [f"z = {z:g}:", *changes(own, found)] if z is not None else []
        faults, healthy = found["faults"], found["healthy"]
        label = "each row's own" if z is None else f"shared, z = {z:g}"
        print(
            f"| {label} | {counts['moved']} / {counts['kept']} | {faults['top1']} of "
            f"{faults['of']} | {faults['top3']} of {faults['of']} | {healthy['quiet']} of "
            f"{healthy['of']} |",
            flush=True,
        )
    if args.detail:
        print("\n".join(["", *details]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
