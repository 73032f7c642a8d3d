"""Sweeps of one variable: the grammar, the one-variable rule, the pruner, the N-looks correction,
and a real in-process sweep that takes one verdict."""

from __future__ import annotations

import json
import random

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from hyprun.diag.verdict import MetricSpec, bonferroni_z, compare
from hyprun.runner.control.baseline import record_baseline
from hyprun.runner.control.sweep import (
    BaselinePruner,
    TrialWatch,
    candidate_deltas,
    distribution,
    parse,
    sweep,
)
from hyprun.runner.errors import BadInput
from hyprun.runner.store.investigation import Store

SPEC = MetricSpec("eval/loss", "min", 0.01)


def test_hydra_sweep_grammar_maps_to_optuna_distributions():
    lr = distribution(parse(["optim.lr=tag(log, interval(1e-5, 1e-3))"]))
    assert lr == FloatDistribution(1e-5, 1e-3, log=True)
    layers = distribution(parse(["model.n_layer=tag(int, interval(2, 8))"]))
    assert layers == IntDistribution(2, 8)
    assert distribution(parse(["optim.lr=choice(1e-4, 3e-4)"])) == CategoricalDistribution(
        [1e-4, 3e-4]
    )
    assert distribution(parse(["model.n_layer=range(2, 8, 2)"])).choices == (2, 4, 6)


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        (["optim.lr=interval(1e-5, 1e-3)", "optim.weight_decay=interval(0, 0.1)"], "2 variables"),
        (["optim.lr=3e-4"], "not a sweep"),
        (["optim.lr=interval(1e-5"], "cannot parse"),
    ],
)
def test_a_sweep_is_one_variable(argument, message):
    with pytest.raises(BadInput, match=message):
        parse(argument)


def test_the_one_variable_rule_holds_for_every_value_of_a_sweep():
    lr = FloatDistribution(1e-5, 1e-3, log=True)
    assert candidate_deltas([], "optim.lr", lr)[0].variable == "optim.lr"
    placement = CategoricalDistribution(["pre", "post"])
    assert candidate_deltas([], "model.placement", placement)[0].variable == "model.placement"
    # A group switch that moves keys both choices share is two variables for some value: the
    # sweep is refused with the pinned form, as a plain test would be.
    with pytest.raises(BadInput, match="hold them at the baseline's values"):
        candidate_deltas([], "sched", CategoricalDistribution(["cosine", "wsd"]))
    with pytest.raises(BadInput, match="controlled variable"):
        candidate_deltas([], "budget.tokens", IntDistribution(1000, 2000))


def _curve(level: float, marks=(2048, 4096, 6144, 8192)) -> list[tuple[int, float]]:
    return [(t, level - 0.01 * i) for i, t in enumerate(marks)]


def test_baseline_pruner_prunes_a_trial_clearly_behind_the_band():
    baseline = {0: _curve(5.00), 1: _curve(5.01), 2: _curve(4.99)}
    study = optuna.create_study(pruner=BaselinePruner(baseline, SPEC, 8192))
    behind, level = study.ask(), study.ask()
    for trial, value in ((behind, 5.6), (level, 5.0)):
        watch = TrialWatch(trial)
        stops = [watch.for_seed(0)(t, v) for t, v in _curve(value)]
        assert any(stops) is (trial is behind)
    assert behind.should_prune() and not level.should_prune()


def test_best_of_n_needs_the_bonferroni_correction():
    """A/A sweeps: 8 trials that change nothing, 3 seeds a side. Picking the best trial and
    judging it as one test confirms by luck far more often than 2.3%; the correction holds it."""
    assert bonferroni_z(2.0, 1) == 2.0 and bonferroni_z(2.0, 8) > bonferroni_z(2.0, 4) > 2.0
    rng = random.Random(0)

    def seeds() -> dict[int, list[tuple[int, float]]]:
        return {s: [(1000, 5.0 + rng.gauss(0, 0.02))] for s in range(3)}

    spec = MetricSpec("eval/loss", "min", 0.0)
    plain = corrected = 0
    rounds = 400
    for _ in range(rounds):
        baseline = seeds()
        trials = [seeds() for _ in range(8)]
        best = min(trials, key=lambda t: sum(v[0][1] for v in t.values()))
        plain += compare(baseline, best, spec).status == "confirmed"
        corrected += compare(baseline, best, spec, looks=8).status == "confirmed"
    assert plain / rounds > 0.05  # the winner's curse
    assert corrected / rounds < 0.035


@pytest.mark.slow  # a baseline and a sweep of jobs
def test_an_in_process_sweep_takes_one_verdict(workdir):
    uri = f"sqlite:///{workdir}/mlflow.db"
    store = Store(uri, "hyprun")
    budget = [
        "budget.tokens=8192",
        "budget.eval_every_tokens=1024",
        "budget.eval_sequences=16",
        f"tracking.uri={uri}",
        f"checkpoint.dir={workdir}/ckpt",
    ]
    record_baseline(store, "sw", budget, seeds=2, why="")
    outcome = sweep(
        store,
        "sw",
        ["optim.lr=choice(1e-7, 3e-3)"],
        trials=2,
        why="I think the LR is off because loss is flat",
    )
    assert outcome.exit_code == 0
    state = store.find("sw")
    [test] = state.tests
    assert test.verdict == outcome.verdict["status"] and state.strikes <= 1
    table = {json.dumps(t["params"]): t["state"] for t in outcome.verdict["trials"]}
    assert table == {'{"optim.lr": 1e-07}': "PRUNED", '{"optim.lr": 0.003}': "COMPLETE"}
    assert outcome.verdict["looks"] == 2 and outcome.verdict["pruned"] == 1
    experiment = store.client.get_run(test.run_id).info.experiment_id
    trials = store.client.search_runs([experiment], "tags.`hyprun.role` = 'sweep-trial'")
    assert sorted(r.data.params["optim.lr"] for r in trials) == ["0.003", "1e-07"]
    if test.verdict == "confirmed":
        assert test.fix == ["optim.lr=0.003"] and test.evidence_run != test.run_id
    with pytest.raises(BadInput, match="tested already"):
        sweep(store, "sw", ["optim.lr=choice(1e-7, 3e-3)"], trials=2, why="again")


@pytest.mark.slow  # a 2-seed baseline, a sweep of 2 trials and a round for the best
def test_a_sweep_decides_its_huge_best_trial_in_rounds(workdir):
    """On a 2-seed baseline a sweep's best trial was judged once at the baseline's seeds, at 1
    df and alpha / trials: a huge gain ended `inconclusive` with no round to follow. It now goes
    on in rounds at alpha / trials, as a plain test does."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    store = Store(uri, "hyprun")
    budget = [
        "budget.tokens=8192",
        "budget.eval_every_tokens=2048",
        "budget.eval_sequences=16",
        f"tracking.uri={uri}",
        f"checkpoint.dir={workdir}/ckpt",
    ]
    record_baseline(store, "huge", [*budget, "optim.lr=1e-5"], seeds=2, why="")
    outcome = sweep(
        store,
        "huge",
        ["optim.lr=choice(3e-3, 1e-2)"],
        trials=2,
        why="I think the LR is far too low because the loss barely moves",
    )
    verdict = outcome.verdict
    assert verdict["effect"] > 0.1, verdict["reason"]
    assert verdict["status"] == "confirmed", verdict["reason"]
    assert verdict["rounds_run"] >= 1 and "alpha / 2" in verdict["reason"]
    assert verdict["seeds"] in (2, 4) and verdict["looks"] == 2
