"""`hyprun sweep 'KEY=SWEEP' --trials N`: one hypothesis about one variable, searched by Optuna.

The variable and its range are written in Hydra's sweep grammar: `optim.lr=tag(log,
interval(1e-5, 1e-3))`, `optim.lr=choice(1e-4, 3e-4)`, `model.n_layer=tag(int, interval(2, 8))`,
`model.n_layer=range(2, 8)`. Optuna (ask/tell; the study in a journal file next to the
investigation, `.hyprun/sweeps/`) proposes the
values. Each trial runs the baseline's seeds through the investigation's launcher (on Slurm each
batch of trials is one job array) and records below its own MLflow run. A trial whose held-out
loss falls clearly behind the baseline band is pruned by `BaselinePruner`, the same rule that
stops a plain test early.

The sweep's verdict is the best trial's, corrected for having looked N times (Bonferroni: the best
of N noisy trials would otherwise beat the baseline by luck far more often than one test). The best
trial goes on in rounds as a plain test does (diag/sequential.py: more seeds for it and the
baseline until a look decides or the seed cap), its design spending alpha / N: as if every trial
went on in rounds at that rate, so the chance that any of them, the best included, is ever
confirmed by luck stays at alpha. Judged once at the baseline's seeds instead, a 2-seed baseline
could confirm nothing (a -40% trial at z = 30.6 was `inconclusive`, with no round to follow). A
sweep is one test: it takes at most one strike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.pruners import BasePruner
from optuna.trial import TrialState

from hyprun.diag.metric import MetricSpec
from hyprun.diag.verdict import early_reject
from hyprun.runner.compose import compose
from hyprun.runner.control.context import DEFAULT_PRIMARY, Outcome, app_of, where_tests_run
from hyprun.runner.control.controller import (
    claim,
    open_test,
    preflight_test,
    refusals_as_outcomes,
    refuse_repeat,
)
from hyprun.runner.control.early import seed_curves
from hyprun.runner.control.one_variable import Delta, measure
from hyprun.runner.control.rounds import in_rounds, seed_configs, test_design
from hyprun.runner.control.verdicts import aggregates, decide, record_error, record_verdict
from hyprun.runner.errors import BadInput, JobsFailed
from hyprun.runner.job.result import JobResult
from hyprun.runner.launch.app import HydraApp
from hyprun.runner.launch.launchers import Failed, InProcess, Job, safe_name, split
from hyprun.runner.store.investigation import State, Store

SWEEPS = Path(".hyprun/sweeps")


def parse(argument: list[str]) -> Override:
    """The one sweep override, or BadInput: a sweep searches one variable."""
    try:
        overrides = OverridesParser.create().parse_overrides(argument)
    except HydraException as error:
        raise BadInput(
            f"cannot parse the sweep ({' '.join(str(error).split())}): write e.g. "
            "'optim.lr=tag(log, interval(1e-5, 1e-3))'"
        ) from None
    if len(overrides) != 1:
        keys = ", ".join(o.key_or_group for o in overrides)
        raise BadInput(
            f"the sweep changes {len(overrides)} variables ({keys}): a sweep searches "
            "one variable; sweep them one at a time"
        )
    if not overrides[0].is_sweep_override():
        raise BadInput(
            f"{argument[0]} is one value, not a sweep: use 'hyprun test {argument[0]}', "
            "or write interval(a, b), choice(a, b, ...) or range(a, b)"
        )
    return overrides[0]


def distribution(override: Override) -> BaseDistribution:
    """Hydra's sweep as an Optuna distribution (interval -> float/int, log when tagged)."""
    if override.is_interval_sweep():
        sweep = override.value()
        log = "log" in sweep.tags
        if "int" in sweep.tags:  # Hydra's interval is a float range; tag(int, ...) makes it whole
            return IntDistribution(int(sweep.start), int(sweep.end), log=log)
        return FloatDistribution(float(sweep.start), float(sweep.end), log=log)
    return CategoricalDistribution(list(override.sweep_iterator()))


def candidates(dist: BaseDistribution) -> list[Any]:
    """Values that bound what the sweep can propose: its ends, or every choice."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    return [dist.low, dist.high]


def as_override(key: str, value: Any) -> str:
    return f"{key}={value:.6g}" if isinstance(value, float) else f"{key}={value}"


def candidate_deltas(
    baseline: list[str], key: str, dist: BaseDistribution, app: HydraApp | None = None
) -> list[Delta]:
    """The delta of each value that bounds the sweep (its ends, or every choice), each held to
    the one-variable rule; the baseline's own value is left out."""
    deltas = []
    for value in candidates(dist):
        try:
            deltas.append(measure(baseline, [as_override(key, value)], app))
        except BadInput as error:
            if "changes nothing" in str(error):
                continue  # the baseline's own value is a fair candidate
            raise
    if not deltas:
        raise BadInput(f"every value of the sweep over {key} equals the baseline's: widen it")
    return deltas


class BaselinePruner(BasePruner):
    """Prunes a trial once its seeds' held-out loss is clearly behind the baseline band
    (hyprun.diag.verdict.early_reject, the rule that stops a plain test early). The trial's curves,
    seed -> [(tokens, loss)], are its `curves` user attribute."""

    def __init__(self, baseline: dict[int, list[tuple[int, float]]], spec: MetricSpec, budget: int):
        self.baseline, self.spec, self.budget = baseline, spec, budget

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        curves = {
            int(seed): [tuple(p) for p in points]
            for seed, points in trial.user_attrs.get("curves", {}).items()
        }
        return early_reject(self.baseline, curves, self.spec, self.budget) is not None


class TrialWatch:
    """Feeds a trial's held-out losses to Optuna as its seeds report them."""

    def __init__(self, trial: optuna.Trial):
        self.trial = trial
        self.curves: dict[str, list[tuple[int, float]]] = {}

    def for_seed(self, seed: int):
        def on_eval(tokens: int, value: float) -> bool:
            self.curves.setdefault(str(seed), []).append((tokens, value))
            self.trial.set_user_attr("curves", self.curves)
            if seed == 0:  # one curve per trial for Optuna's own plots
                self.trial.report(value, tokens)
            return self.trial.should_prune()

        return on_eval


@refusals_as_outcomes
def sweep(
    store: Store,
    name: str | None,
    argument: list[str],
    trials: int,
    why: str,
    parallel: int | None = None,
) -> Outcome:
    """Search one variable with Optuna; one verdict, one strike at most."""
    state = open_test(store, name, why)
    argument, launcher_overrides = split(argument)
    override = parse(argument)
    key, dist = override.key_or_group, distribution(override)
    app = app_of(state)
    deltas = candidate_deltas(state.baseline["overrides"], key, dist, app)
    for delta in deltas:  # each bound checked as its trial's job will check it, before a claim
        preflight_test(state.baseline["overrides"], delta, app)
    if trials < 2:
        raise BadInput(f"--trials {trials}: a sweep needs 2 or more (one value: 'hyprun test')")
    refuse_repeat(state, list(argument))
    launcher = where_tests_run(state, launcher_overrides, f"H{len(state.tests) + 1}-sweep")
    test_run, number = claim(store, state, Delta(tuple(argument), key, {}, ()), None, why)

    label = f"H{number} {key}: sweep {trials} trials"
    study = _study(store, state, number, key, dist, trials)
    record = {"study": study.study_name, "trials": trials, "storage": str(_journal(state))}
    store.tag(test_run, {"hyprun.sweep": json.dumps(record)})
    batch = 1 if isinstance(launcher, InProcess) else (parallel or trials)
    try:
        while (left := trials - sum(t.state.is_finished() for t in study.trials)) > 0:
            asked = [study.ask({key: dist}) for _ in range(min(batch, left))]
            _run_trials(store, state, test_run, number, key, asked, study, launcher)
        table = _table(study)
        store.text(test_run, json.dumps(table, indent=2, default=str), "sweep.json")
        verdict, extra = _verdict(store, state, study, key, table, launcher)
    except Exception as error:  # infrastructure, not evidence: no strike
        return record_error(store, test_run, label, error)
    return record_verdict(store, state, test_run, label, verdict, extra)


def primary_of(state: State) -> MetricSpec:
    """The metric a sweep optimises: our eval/loss, or the app's declared metric."""
    app = app_of(state)
    return app.metric() if app is not None else DEFAULT_PRIMARY


def budget_of_baseline(state: State) -> int:
    """The baseline's budget in the primary metric's steps (tokens for our job)."""
    app = app_of(state)
    if app is not None:
        return app.budget(state.baseline["overrides"])
    return int(compose(state.baseline["overrides"]).budget.tokens)


def _journal(state: State) -> Path:
    return SWEEPS / f"{safe_name(state.name)}.journal"


def _study(
    store: Store, state: State, number: int, key: str, dist: BaseDistribution, trials: int
) -> optuna.Study:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = _journal(state)
    path.parent.mkdir(parents=True, exist_ok=True)
    primary = primary_of(state)
    baseline = seed_curves(store, state.baseline["seed_runs"], primary.metric)
    study = optuna.create_study(
        storage=JournalStorage(JournalFileBackend(str(path))),
        study_name=f"{state.name}/H{number}",
        direction="maximize" if primary.direction == "max" else "minimize",
        sampler=optuna.samplers.TPESampler(seed=0),
        pruner=BaselinePruner(baseline, primary, budget_of_baseline(state)),
    )
    if isinstance(dist, CategoricalDistribution):  # every choice once before any repeats
        for choice in dist.choices[:trials]:
            study.enqueue_trial({key: choice})
    return study


def _run_trials(
    store: Store,
    state: State,
    test_run: str,
    number: int,
    key: str,
    asked: list[optuna.Trial],
    study: optuna.Study,
    launcher,
) -> None:
    """One batch of trials: their seeds as one launch; each trial told its value or fate."""
    jobs, runs = [], {}
    for trial in asked:
        value = trial.params[key]
        trial_label = f"H{number}.{trial.number} {as_override(key, value)}"
        runs[trial.number] = store.child(
            test_run,
            trial_label,
            {
                "hyprun.role": "sweep-trial",
                "hyprun.investigation": state.name,
                "hyprun.variable": key,
                "hyprun.trial": str(trial.number),
                "hyprun.value": str(value),
            },
        )
        store.params(runs[trial.number], {"variable": key, key: str(value)})
        trial.set_user_attr("run_id", runs[trial.number])
        watch = TrialWatch(trial)
        configs = seed_configs(
            store,
            state,
            [as_override(key, value)],
            runs[trial.number],
            f"H{number}.{trial.number}",
            key,
        )
        jobs += [
            Job(cfg, watch.for_seed(seed), group=str(trial.number))
            for seed, cfg in enumerate(configs)
        ]
    outcomes = launcher.run(jobs, lambda ids: store.tag(test_run, {"slurm.jobs": ",".join(ids)}))
    for trial in asked:
        mine = [o for j, o in zip(jobs, outcomes, strict=True) if j.group == str(trial.number)]
        run_id = runs[trial.number]
        if any(isinstance(o, Failed) for o in mine):
            study.tell(trial, state=TrialState.FAIL)
            reason = "; ".join(o.reason for o in mine if isinstance(o, Failed))
            store.tag(run_id, {"hyprun.verdict": "error", "hyprun.reason": reason})
            store.finish(run_id, "FAILED")
        elif any(isinstance(o, JobResult) and o.status == "stopped" for o in mine) or (
            None in mine
        ):
            study.tell(trial, state=TrialState.PRUNED)
            store.tag(run_id, {"hyprun.verdict": "pruned"})
            store.finish(run_id)
        else:
            verdict = decide(store, state, mine, primary_of(state), [])
            study.tell(trial, verdict["test_value"])
            store.tag(
                run_id, {"hyprun.verdict": verdict["status"], "hyprun.reason": verdict["reason"]}
            )
            store.metrics(run_id, aggregates(verdict), step=verdict["tokens"])
            store.finish(run_id)


def _table(study: optuna.Study) -> list[dict[str, Any]]:
    return [
        {
            "trial": t.number,
            "params": t.params,
            "state": t.state.name,
            "value": t.value,
            "run_id": t.user_attrs.get("run_id"),
        }
        for t in study.trials
    ]


def _verdict(
    store: Store,
    state: State,
    study: optuna.Study,
    key: str,
    table: list[dict[str, Any]],
    launcher,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The best trial's verdict, in rounds, corrected for every trial looked at (failed ones
    were not)."""
    looks = sum(t.state != TrialState.FAIL for t in study.trials)
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    pruned = sum(t.state == TrialState.PRUNED for t in study.trials)
    if not complete:
        if looks == 0:
            raise JobsFailed("every trial failed")
        reason = f"all {pruned} trials fell clearly behind the baseline band and were pruned"
        return {
            "status": "rejected",
            "reason": reason,
            "effect": None,
            "looks": looks,
            "pruned": pruned,
            "trials": table,
        }, {}
    primary = primary_of(state)
    best = (max if primary.direction == "max" else min)(complete, key=lambda t: t.value)
    best_run = best.user_attrs["run_id"]
    best_delta = as_override(key, best.params[key])
    verdict = _best_in_rounds(store, state, best, best_delta, key, launcher, looks)
    verdict.update(best=best_delta, best_trial=best.number, pruned=pruned, trials=table)
    verdict["reason"] = (
        f"best {best_delta} (trial {best.number}, {pruned} pruned): " + verdict["reason"]
    )
    extra = {"hyprun.best_delta": json.dumps([best_delta]), "hyprun.best_run": best_run}
    return verdict, extra


def _best_in_rounds(
    store: Store,
    state: State,
    best: optuna.trial.FrozenTrial,
    best_delta: str,
    key: str,
    launcher,
    looks: int,
) -> dict[str, Any]:
    """The best trial judged as a test in rounds at alpha / looks: its seeds so far are the
    first look; more seeds (its own and the baseline's) only when that look cannot decide."""
    best_run = best.user_attrs["run_id"]
    number = best_run_label(store, best_run)
    designed = test_design(store, state, None, 0, trials=looks)
    verdict = in_rounds(
        store,
        state,
        best_run,
        f"{number} {best_delta}",
        Delta((best_delta,), key, {}, ()),
        launcher,
        designed,
        primary_of(state),
        [],
        looks,
    )
    store.tag(best_run, {"hyprun.verdict": verdict["status"], "hyprun.reason": verdict["reason"]})
    return verdict


def best_run_label(store: Store, run_id: str) -> str:
    """The trial's label prefix (H3.1): its seed runs are named after it."""
    return store.run(run_id).info.run_name.split()[0]
