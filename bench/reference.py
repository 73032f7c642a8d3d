"""The healthy reference: what healthy runs measure, for every feature a training row reads.

    python -m bench.reference --split DIR --apps DIR --corpus DIR

reads the recorded baselines of three healthy populations, all on the tuning side (a held-out
run never sets anything):
- our GPT job: the split's `healthy` set (bench/diagnosis/split.yaml), from DIR/split.json of a
  `python -m bench.diagnosis.split --set healthy --workdir DIR` run;
- the foreign apps: the healthy entries of the apps' tuning set (bench/apps/split.yaml), each
  seed of a `python -m bench.apps --set tuning --workdir DIR` run;
- the corpus loops: the clean twins of the corpus's tuning rows (bench/corpus/split.yaml), from
  a `python -m bench.corpus --set tuning --workdir DIR` run;

and writes diag/tables/healthy_reference.yaml (schema: hyprun.diag.reference). Triage shows
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", type=Path, required=True, help="GPT split workdir")
    parser.add_argument("--apps", type=Path, required=True, help="apps tuning workdir")
    parser.add_argument("--corpus", type=Path, required=True, help="corpus tuning workdir")
    parser.add_argument("--out", type=Path, default=REFERENCE)
    args = parser.parse_args(argv)
    wanted = dynamics_features()
    runs = gpt_runs(args.split, wanted) | app_runs(args.apps, wanted)
    runs |= corpus_runs(args.corpus, wanted)
    text = yaml.safe_dump({"runs": runs}, sort_keys=False, default_flow_style=None, width=100)
    args.out.write_text(HEADER + text)
    print(f"{len(runs)} healthy runs, {len(wanted)} features -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
