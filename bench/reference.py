"""The healthy reference: what healthy runs measure, for every feature a training row reads.

    python -m bench.reference --split DIR --apps DIR --corpus DIR
    python -m bench.reference --rerun DIR [--split DIR]

reads the recorded baselines of three healthy populations, all on the tuning side (a held-out
run never sets anything):
- our GPT job: the split's `healthy` set (bench/diagnosis/split.yaml), from DIR/split.json of a
  `python -m bench.diagnosis.split --set healthy --workdir DIR` run;
- the foreign apps: the healthy entries of the apps' tuning set (bench/apps/split.yaml), each
  seed of a `python -m bench.apps --set tuning --workdir DIR` run;
- the corpus loops: the clean twins of the corpus's tuning rows (bench/corpus/split.yaml), from
  a `python -m bench.corpus --set tuning --workdir DIR` run;

and writes diag/tables/healthy_reference.yaml (schema: hyprun.diag.reference). `--rerun DIR`
first runs the apps' healthy tuning entries and the corpus's tuning twins again into DIR (the
same configs and data seeds, baselines and diagnosis only, nothing scored) and reads those; a
feature added since a population was recorded is then measured on it. Without `--split`, the
GPT rows are kept from the current file (the split's healthy set is 37 runs of our job, an
hour here; say which in the commit). Triage shows
each number a finding cuts beside the healthy range, and tests/test_reference.py holds every
row to it: no row fires on a healthy reference run.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.apps.run import entry_folder
from bench.apps.split import load_split as load_apps_split
from bench.corpus.split import load_split as load_corpus_split
from bench.diagnosis.split import load_split, name_of
from hyprun.diag.reference import REFERENCE, dynamics_features

HEADER = """\
# What healthy runs measure, for every feature a training row reads (generated: python -m
# bench.reference; see its docstring for the three populations, all on the tuning side).
# Schema: hyprun.diag.reference. Do not edit by hand: regenerate from the recorded runs.
"""


def _numeric(features: dict[str, Any], wanted: set[str]) -> dict[str, float]:
    """The wanted features that are finite numbers, at 4 significant digits."""
    out = {}
    for name in sorted(wanted):
        value = features.get(name)
        if isinstance(value, int | float) and math.isfinite(value):
            out[name] = float(f"{value:.4g}")
    return out


def gpt_runs(workdir: Path, wanted: set[str]) -> dict[str, dict[str, float]]:
    """The split's healthy set, from the features its run recorded in split.json."""
    results = json.loads((workdir / "split.json").read_text())
    return {
        f"gpt/{name_of(item)}": _numeric(results[name_of(item)]["features"], wanted)
        for item in load_split()["healthy"]
        if results.get(name_of(item), {}).get("features")
    }


def _baselines(folder: Path, label: str, wanted: set[str]) -> dict[str, dict[str, float]]:
    """Every baseline seed run recorded under `folder`, diagnosed as `hyprun diagnose` does."""
    from mlflow import MlflowClient

    from hyprun.runner.control.diagnose import diagnose

    out = {}
    for db in sorted(glob.glob(f"{folder}/mlflow.db")):
        uri = f"sqlite:///{db}"
        client = MlflowClient(uri)
        for experiment in client.search_experiments():
            for run in client.search_runs([experiment.experiment_id]):
                name = run.info.run_name or ""
                if "baseline · seed" not in name:
                    continue
                _, document = diagnose(uri, run.info.run_id, experiment.name)
                values = {k: f["value"] for k, f in document["features"].items()}
                out[f"{label} seed {name.rsplit(' ', 1)[-1]}"] = _numeric(values, wanted)
    return out


def app_runs(workdir: Path, wanted: set[str]) -> dict[str, dict[str, float]]:
    """The apps' tuning-side healthy entries, each seed of each."""
    out = {}
    for entry in load_apps_split()["tuning"]:
        if entry.kind == "healthy":
            folder = entry_folder(workdir, entry.id, entry.seed)
            out |= _baselines(folder, f"apps/{entry.id}", wanted)
    return out


def corpus_runs(workdir: Path, wanted: set[str]) -> dict[str, dict[str, float]]:
    """The clean twins of the corpus's tuning rows (folders named ROW-twin)."""
    out = {}
    for row in load_corpus_split()["tuning"]:
        out |= _baselines(workdir / f"{row}-twin", f"corpus/{row}-twin", wanted)
    return out


def rerun(workdir: Path) -> tuple[Path, Path]:
    """The apps' healthy tuning entries and the corpus's tuning twins run again into
    workdir/apps and workdir/corpus, as their benchmarks run them; the two folders."""
    import sys

    from bench.apps.run import run_entry
    from bench.apps.schema import load_table
    from bench.corpus.run import run_row
    from bench.corpus.schema import all_rows
    from bench.diagnosis.run import worker_setup
    from hyprun.runner.provenance import git_state

    root = Path(__file__).resolve().parents[1]
    if str(root) not in sys.path:  # the corpus loop is imported by name from its folder
        sys.path.insert(0, str(root))
    worker_setup(1, git_state()[0])
    apps, corpus = (workdir / "apps").resolve(), (workdir / "corpus").resolve()
    table, rng = load_table(), np.random.default_rng(26)
    for entry in load_apps_split()["tuning"]:
        if entry.kind == "healthy":
            run_entry(table, entry, entry_folder(apps, entry.id, entry.seed), rng)
    by_id, seen = {row.id: row for row in all_rows()}, set()
    for row_id in load_corpus_split()["tuning"]:
        row = by_id[row_id]
        if tuple(row.twin_overrides) not in seen:  # rows sharing a twin share its run
            seen.add(tuple(row.twin_overrides))
            run_row(row, corpus / f"{row.id}-twin", twin=True)
    return apps, corpus


def kept_gpt_runs(path: Path) -> dict[str, dict[str, float]]:
    """The GPT rows of the current reference file, unchanged."""
    runs = yaml.safe_load(path.read_text())["runs"]
    return {name: values for name, values in runs.items() if name.startswith("gpt/")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", type=Path, help="GPT split workdir (default: keep the rows)")
    parser.add_argument("--apps", type=Path, help="apps tuning workdir")
    parser.add_argument("--corpus", type=Path, help="corpus tuning workdir")
    parser.add_argument("--rerun", type=Path, help="run both populations again into this DIR")
    parser.add_argument("--out", type=Path, default=REFERENCE)
    args = parser.parse_args(argv)
    if args.rerun:
        args.apps, args.corpus = rerun(args.rerun)
    if not (args.apps and args.corpus):
        parser.error("give --apps and --corpus, or --rerun DIR")
    wanted = dynamics_features()
    gpt = gpt_runs(args.split, wanted) if args.split else kept_gpt_runs(args.out)
    runs = gpt | app_runs(args.apps, wanted) | corpus_runs(args.corpus, wanted)
    text = yaml.safe_dump({"runs": runs}, sort_keys=False, default_flow_style=None, width=100)
    args.out.write_text(HEADER + text)
    print(f"{len(runs)} healthy runs, {len(wanted)} features -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
