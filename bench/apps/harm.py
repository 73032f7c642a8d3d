"""`python -m bench.apps.harm --set SET --workdir DIR`: how much each scored fault entry hurt,
measured after the fact beside its score (it changes no score): the final metric of the fault's
two baseline seeds (read from the benchmark's MLflow files in DIR) against its clean twin's
(twin_of: the same base, setting and data seed, the fault not planted), trained now, same seeds.
A fault that does no harm at this budget leaves nothing to diagnose (bench/diagnosis's HARM).
Writes results/harm_SET.json."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import yaml

from bench.apps.__main__ import RESULTS, ROOT
from bench.apps.run import (
    EXPERIMENT,
    SEEDS,
    entry_folder,
    entry_overrides,
    folder_of,
    investigation_name,
)
from bench.apps.schema import load_table, twin_of
from bench.apps.split import SETS, SPLIT, load_split
from bench.corpus.split import sha256
from bench.diagnosis.run import inside, worker_setup


def finals(store, name: str, metric: str) -> list[float]:
    """The last logged value of `metric` on each baseline seed of investigation `name`."""
    state = store.find(name)
    out = []
    for run_id in state.baseline["seed_runs"]:
        history = store.client.get_metric_history(run_id, metric)
        out.append(max(history, key=lambda m: m.step).value if history else float("inf"))
    return out


def parse_scored(prog: str, doc: str, argv: list[str] | None):
    """(args, the split file, the scored set's name as results/ knows it) of a measurement made
    after a benchmark run; None, with one line said, when the draw named is not there."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("--set", choices=SETS, required=True, dest="set_name")
    parser.add_argument("--workdir", required=True, help="the benchmark run's --workdir")
    parser.add_argument("--draw", type=Path, help="the later held-out draw that run scored")
    args = parser.parse_args(argv)
    split = args.draw or SPLIT
    if not split.exists():
        print(f"no {split}: name a draw that bench.apps scored", file=sys.stderr)
        return None
    seed = yaml.safe_load(split.read_text())["seed"]
    return args, split, f"{args.set_name}-{seed}" if args.draw else args.set_name


def main(argv: list[str] | None = None) -> int:
    parsed = parse_scored("python -m bench.apps.harm", __doc__, argv)
    if parsed is None:
        return 2
    args, split, name_of_set = parsed
    from hyprun.runner.control.baseline import record_baseline
    from hyprun.runner.launch.app import HydraApp
    from hyprun.runner.launch.declaration import load_declaration
    from hyprun.runner.provenance import git_state
    from hyprun.runner.store.investigation import Store

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    worker_setup(1, git_state()[0])
    table, rows = load_table(), []
    for entry in [e for e in load_split(split)[args.set_name] if e.family]:
        form = table.forms[entry.form]
        metric = load_declaration(folder_of(form.app) / "hyprun.yaml").metric.name
        name = investigation_name(entry.id)
        folder = entry_folder(args.workdir, entry.id, entry.seed)
        fault = finals(Store(f"sqlite:///{folder}/mlflow.db", EXPERIMENT), name, metric)
        twin_folder = folder.with_name(folder.name + "-twin")
        seed = entry_overrides(table, entry)[-1]
        with inside(twin_folder):
            store = Store(f"sqlite:///{twin_folder}/mlflow.db", EXPERIMENT)
            twin_overrides = [*twin_of(table, entry), seed]
            app = HydraApp.load(form.app)
            record_baseline(store, name, twin_overrides, SEEDS, "twin", app=app)
            twin = finals(store, name, metric)
        change = statistics.fmean(fault) / statistics.fmean(twin) - 1
        rows.append({"id": entry.id, "fault": fault, "twin": twin, "change": change})
        print(f"{entry.id}: fault {fault} twin {twin} change {change:+.1%}", flush=True)
    write_measured(RESULTS / f"harm_{name_of_set}.json", split, rows)
    return 0


def write_measured(out: Path, split: Path, rows: list[dict]) -> None:
    """A measurement's rows with when and on which split (its SHA-256) they were taken."""
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "split": split.resolve().relative_to(ROOT).as_posix(),
        "split_sha256": sha256(split),
    }
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
