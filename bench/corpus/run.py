"""One corpus row through hyprun's method, as a user of the app would run it.

Fault: `hyprun baseline` of the app with the bug's switch on (2 seeds), `hyprun diagnose` of
seed 0, then `hyprun test` of what the findings point to, in their order, until one is
confirmed or the third strike: a finding that names the row's root cause points to the code fix
(the switch off, a one-variable test), every other finding to its cards (translated by the
app's knobs). Twin: the baseline and the diagnosis only; any finding is an alarm. Reuses
bench/diagnosis/run.py's folder, triage and collection helpers; records everything in the
row's own MLflow sqlite file.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.corpus.schema import Row
from bench.diagnosis.run import Scenario, _collect, _triage, inside
from bench.diagnosis.split import STRIKES

EXPERIMENT = "bench-corpus"
APP = "bench.corpus.apps.{form}.train:main"
SEEDS = 2
MAX_SEEDS = 2
CODE_FIX = "code_fix"
"""The name the orders give a row's code fix (its switch off) where a finding names the cause."""


def scenario_of(row: Row, twin: bool, extra: tuple[str, ...] = ()) -> Scenario:
    """The row as bench/diagnosis's Scenario, so its triage and collection helpers apply;
    `extra`: overrides of both sides (a later draw's data seed)."""
    return Scenario(
        name=row.id + ("-twin" if twin else ""),
        kind="control" if twin else "fault",
        fault=row.root_cause,
        base=(*(row.twin_overrides if twin else row.fault_overrides), *extra),
        plant=(),
        cause=() if twin else tuple(row.cause),
        fix=() if twin else (*row.fix_cards, CODE_FIX),
    )


def run_row(
    row: Row, workdir: Path, twin: bool = False, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The method on one row (or its twin) in `workdir`; a result dict, never raising."""
    scenario = scenario_of(row, twin, extra)
    result: dict[str, Any] = {
        "name": scenario.name,
        "row": row.id,
        "twin": twin,
        "findings": [],
        "cards": [],
        "tests": [],
        "rank": None,
        "confirmed": None,
        "error": None,
        "seeds": 1 if twin else SEEDS,
        "budget_tokens": 0,
    }
    start = time.monotonic()
    try:
        with inside(Path(workdir).resolve()):
            _investigate(row, scenario, Path(workdir).resolve(), result)
    except Exception as error:  # a broken row is a result too, not a crashed benchmark
        result["error"] = f"{type(error).__name__}: {error}"[:2000]
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def _investigate(row: Row, scenario: Scenario, workdir: Path, result: dict[str, Any]) -> None:
    from hyprun.runner.control import controller
    from hyprun.runner.control.baseline import record_baseline
    from hyprun.runner.control.diagnose import diagnose
    from hyprun.runner.errors import BadInput
    from hyprun.runner.launch.app import HydraApp
    from hyprun.runner.store.investigation import Store

    store = Store(f"sqlite:///{workdir}/mlflow.db", EXPERIMENT)
    app = HydraApp.load(APP.format(form=row.form))
    overrides = list(scenario.base)
    state = record_baseline(store, scenario.name, overrides, result["seeds"], row.saw, app=app)
    _, document = diagnose(store.uri, state.baseline["seed_runs"][0], store.experiment)
    _triage(scenario, document, result)
    result["cards"] = list(dict.fromkeys(c for f in document["findings"] for c in f["cards"]))
    result["first_actions"] = {f["id"]: f.get("first_action", "") for f in document["findings"]}
    if scenario.kind == "control":
        _collect(store, scenario.name, scenario, result)
        return
    for name, argument in hyprun_order(row, result):
        try:
            outcome = controller.test(store, scenario.name, argument, name, max_seeds=MAX_SEEDS)
        except BadInput as refused:  # changes nothing, or a controlled key: not a test
            result.setdefault("skipped", []).append({"card": name, "reason": str(refused)})
            continue
        if outcome.verdict is None or outcome.exit_code == controller.EXIT_ESCALATED:
            break
        if outcome.verdict["status"] == "confirmed":
            result["confirmed"] = name
            break
        if store.find(scenario.name).escalated:
            break
    _collect(store, scenario.name, scenario, result)


def hyprun_order(row: Row, result: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """What the ranked findings point to, in order: the code fix where a top-3 finding names
    the root cause, else each finding's cards; at most STRIKES + 1 entries are ever tested."""
    order: list[tuple[str, list[str]]] = []
    if result["rank"] is not None and result["rank"] <= 3:
        order.append((CODE_FIX, [f"{row.switch}=false"]))
    order += [(card, [card]) for card in result["cards"]]
    return order[: STRIKES + 1]
