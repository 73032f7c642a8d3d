"""One app-benchmark entry through hyprun, as a user of the app would run it: `hyprun baseline`
of the app with the fault planted (2 seeds), `hyprun diagnose` of seed 0, and where the true
cause ranks among the findings. Strikes to the fix are simulated from that ranking (the three
orders of bench/corpus), not run. And the early-rejection check: a clearly worse test (LR 100x
below the form's best) run for real against the form's default baseline, its steps saved read
from the test's MLflow runs. Reuses bench/diagnosis/run.py's folder and triage helpers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.apps.schema import Entry, Table, overrides_of, plant
from bench.corpus.__main__ import simulate
from bench.corpus.cards import applicable
from bench.corpus.run import CODE_FIX
from bench.diagnosis.run import Scenario, _triage, inside

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = "bench-apps"
SEEDS = 2
EARLY_SEEDS = 3
"""Baseline seeds for the early-rejection check (as tests/test_app_early.py's Lightning case)."""
EARLY_LR_FACTOR = 100


def folder_of(app: str) -> Path:
    """The app's folder (its hyprun.yaml and conf/) from its module path."""
    return Path(ROOT, *app.split(":")[0].split(".")[:-1])


def investigation_name(entry_id: str) -> str:
    """An entry's investigation in its MLflow store ("hf/lr_high@30" -> "hf-lr_high@30")."""
    return entry_id.replace("/", "-")


def entry_folder(workdir: Path, entry_id: str, seed: int) -> Path:
    """Where a benchmark run under `workdir` keeps an entry's MLflow store."""
    return Path(workdir, f"{investigation_name(entry_id)}-{seed}").resolve()


def entry_overrides(table: Table, entry: Entry) -> list[str]:
    return [
        *overrides_of(table, entry),
        f"{table.forms[entry.form].keys['data_seed']}={entry.seed}",
    ]


def run_entry(table: Table, entry: Entry, workdir: Path, rng: np.random.Generator) -> dict:
    """Baseline, diagnosis and simulated strikes of one entry; a result dict, never raising."""
    family = table.families[entry.family] if entry.family else None
    scenario = Scenario(
        name=investigation_name(entry.id),
        kind=entry.kind,
        fault=entry.family or "",
        base=tuple(entry_overrides(table, entry)),
        plant=(),
        cause=tuple(family.cause) if family else (),
        fix=tuple(family.fix) if family else (),
    )
    result: dict[str, Any] = {
        "id": entry.id,
        "form": entry.form,
        "family": entry.family,
        "m": entry.m,
        "seed": entry.seed,
        "kind": entry.kind,
        "overrides": list(scenario.base),
        "plant": plant(table, entry),
        "findings": [],
        "rank": None,
        "cards": [],
        "error": None,
    }
    start = time.monotonic()
    try:
        with inside(Path(workdir).resolve()):
            _diagnose(table, entry, scenario, Path(workdir).resolve(), result)
        if family:
            useful = sorted(applicable(entry.form, list(scenario.base), _folder(table, entry)))
            fix = set(family.fix)
            detected = result["rank"] is not None and result["rank"] <= 3
            result["orders"] = simulate(
                useful, fix, detected and CODE_FIX in fix, result["cards"], rng
            )
    except Exception as error:  # a broken entry is a result too, not a crashed benchmark
        result["error"] = f"{type(error).__name__}: {error}"[:2000]
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def _folder(table: Table, entry: Entry) -> Path:
    return folder_of(table.forms[entry.form].app)


def _diagnose(table: Table, entry: Entry, scenario: Scenario, workdir: Path, result: dict) -> None:
    from hyprun.runner.control.baseline import record_baseline
    from hyprun.runner.control.diagnose import diagnose
    from hyprun.runner.launch.app import HydraApp
    from hyprun.runner.store.investigation import Store

    store = Store(f"sqlite:///{workdir}/mlflow.db", EXPERIMENT)
    app = HydraApp.load(table.forms[entry.form].app)
    saw = f"app benchmark entry {entry.id}"
    state = record_baseline(store, scenario.name, list(scenario.base), SEEDS, saw, app=app)
    _, document = diagnose(store.uri, state.baseline["seed_runs"][0], store.experiment)
    _triage(scenario, document, result)
    result["cards"] = list(dict.fromkeys(c for f in document["findings"] for c in f["cards"]))


def early_rejection(table: Table, form_name: str, workdir: Path) -> dict[str, Any]:
    """A clearly worse test (LR 100x below best) against the form's default baseline, for real:
    its verdict, whether it stopped early, and the share of its planned steps saved."""
    from hyprun.runner.control import controller
    from hyprun.runner.control.baseline import record_baseline
    from hyprun.runner.launch.app import HydraApp
    from hyprun.runner.store.investigation import Store

    form = table.forms[form_name]
    delta = f"{form.keys['lr']}={form.best_lr / EARLY_LR_FACTOR:.4g}"
    result: dict[str, Any] = {"form": form_name, "delta": delta, "error": None}
    start = time.monotonic()
    try:
        with inside(Path(workdir).resolve()):
            store = Store(f"sqlite:///{Path(workdir).resolve()}/mlflow.db", EXPERIMENT)
            app = HydraApp.load(form.app)
            name = f"early-{form_name}"
            why = "clearly worse: the LR 100x below the form's best"
            record_baseline(store, name, list(form.base), EARLY_SEEDS, why, app=app)
            controller.test(store, name, [delta], why)
            test = store.find(name).tests[-1]
            metrics = store.run(test.run_id).data.metrics
            seeds = store.seed_runs(test.run_id)
            result.update(
                verdict=test.verdict,
                early=test.tags.get("hyprun.early") == "true",
                spent=test.tags.get("hyprun.spent", ""),
                saved_frac=metrics.get("tokens_saved_frac"),
                seeds_run=len(seeds),
                seed_steps=[int(r.data.tags.get("hyprun.steps", 0)) for r in seeds],
            )
    except Exception as error:
        result["error"] = f"{type(error).__name__}: {error}"[:2000]
    result["seconds"] = round(time.monotonic() - start, 1)
    return result
