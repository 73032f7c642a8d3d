"""A test's seeds, in rounds: from the baseline's seed count up to a cap, each round one job
array with the baseline seeds it still lacks, until a look decides (diag/sequential.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from hyprun.diag.metric import MetricSpec
from hyprun.diag.sequential import Design, plan
from hyprun.diag.verdict import load_params
from hyprun.runner.control.baseline import baseline_seed_config, claim_baseline_seed
from hyprun.runner.control.context import app_of, console, job_config
from hyprun.runner.control.early import EarlyRejection
from hyprun.runner.control.one_variable import Delta
from hyprun.runner.control.verdicts import decide
from hyprun.runner.errors import BadInput, JobsFailed
from hyprun.runner.job.result import JobResult
from hyprun.runner.launch.launchers import Failed, InProcess, Job, Slurm, budget_of, result_of
from hyprun.runner.store.investigation import ARM, State, Store, baseline_seed_key


def test_design(
    store: Store, state: State, max_seeds: int | None, max_tokens: int, trials: int = 1
) -> tuple[Design, str]:
    """The test's looks: from the baseline's seed count up to the seed cap, in rounds, as far
    as the token cap reaches (diag/sequential.py), and which cap ends it. Bad caps are refused
    before anything runs. `trials` > 1: the test is the best of a sweep's trials, its rounds
    spend alpha / trials (Bonferroni: as if every trial went on in rounds at that rate)."""
    params = load_params()
    rule = params.sequential
    start = state.baseline["seeds"]
    cap = rule.max_seeds if max_seeds is None else max_seeds
    if cap < 1:
        raise BadInput(f"--max-seeds {cap}: a test needs at least 1 seed per side")
    if max_tokens < 0:
        raise BadInput(f"--max-tokens {max_tokens}: give a positive token count (0: no cap)")
    # one seed's budget, from a job config that is built, never run (an app's own steps too)
    probe = job_config(store, state.baseline["overrides"], 0, state.run_id, "", {}, app_of(state))
    budget = budget_of(probe)
    if max_tokens and max_tokens < start * budget:
        raise BadInput(
            f"--max-tokens {max_tokens:,} is below one round of {start} seeds x {budget:,} "
            f"{state.unit}: give at least {start * budget:,}"
        )
    design = plan(
        start,
        max(start, cap),
        params.alpha / max(1, trials),
        round_seeds=rule.round_seeds,
        tokens_per_seed=budget,
        max_tokens=max_tokens,
        confirm_spending=rule.confirm_spending,
        reject_spending=rule.reject_spending,
    )
    if design.max_seeds < max(start, cap):
        limit = f"{state.unit.removesuffix('s')} cap ({max_tokens:,} {state.unit}"
        return design, f"{limit}: {design.max_seeds} seeds per side)"
    if len(design.seeds) == 1:
        return design, f"seed cap ({design.max_seeds} per side: the fixed-k rule)"
    return design, f"seed cap ({design.max_seeds} per side)"


def in_rounds(
    store: Store,
    state: State,
    test_run: str,
    label: str,
    delta: Delta,
    launcher: InProcess | Slurm,
    designed: tuple[Design, str],
    primary: MetricSpec,
    guards: list[MetricSpec],
    looks: int = 1,
) -> dict[str, Any]:
    """Run the design's rounds until a look decides (diag/sequential.py): each round trains the
    test's missing seeds and the baseline seeds nobody recorded yet, as one job array. A test
    resumed after a crash replays its looks on the seeds already recorded (same data, same
    decisions) and goes on where it stopped. `designed`: the design and the cap that ends it;
    `looks`: the test is the best of that many sweep trials (its design spends alpha / looks)."""
    design, cap = designed
    app = app_of(state)
    watch = EarlyRejection(store, primary, app.metric().metric if app else "eval/loss")
    done = finished_seeds(store, test_run)  # a resumed test does not rerun finished seeds
    spent = {"test": sum(r.trained(state.unit) for r in done.values()), "baseline": 0}
    for look, seeds in enumerate(design.seeds):
        store.tag(test_run, {"hyprun.round": f"{look + 1}/{len(design.seeds)}"})
        configs = seed_configs(
            store, state, delta.overrides, test_run, label.split()[0], delta, seeds
        )
        watch.start_round(state, design, [s for s in range(seeds) if state.baseline_run(s)])
        watch.partial = {
            seed: store.history(result.run_id, primary.metric)
            for seed, result in done.items()
            if seed < seeds
        }
        jobs = [
            Job(configs[seed], watch.for_seed(seed, budget_of(configs[seed])), group="test")
            for seed in range(seeds)
            if seed not in done
        ]
        state, ran, baseline_tokens = run_round(
            store, state, test_run, launcher, jobs, seeds, lambda: watch.stop is not None
        )
        spent["baseline"] += baseline_tokens
        spent["test"] += sum(r.trained(state.unit) for r in ran.values())
        done.update({s: r for s, r in ran.items() if r.status in ("completed", "diverged")})
        # this look's seeds only: a resumed test may hold seeds of a later round already
        results = [done.get(s) or ran[s] for s in range(seeds) if s in done or s in ran]
        if watch.stop is not None:
            verdict = watch.verdict(results, seeds)
            return rounds_taken(verdict, design, look, seeds, spent, "rejected early")
        baseline_runs = [state.baseline_run(s) for s in range(seeds)]
        verdict = decide(store, state, results, primary, guards, looks, baseline_runs, design)
        if verdict["status"] != "inconclusive" or verdict["final"]:
            return rounds_taken(
                verdict, design, look, seeds, spent, stop_reason(verdict, look, cap)
            )
        console.print(
            f"{label}: inconclusive with {seeds} seeds per side; round {look + 2} of "
            f"{len(design.seeds)} adds seeds up to {design.seeds[look + 1]}"
        )
    raise AssertionError("the last look of a design is final")  # unreachable


def rounds_taken(
    verdict: dict[str, Any],
    design: Design,
    look: int,
    seeds: int,
    spent: dict[str, int],
    why: str,
) -> dict[str, Any]:
    """The verdict with how many seeds it took and why the test stopped there."""
    return {
        **verdict,
        "seeds": seeds,
        "rounds_run": look + 1,
        "rounds_planned": len(design.seeds),
        "stopped": why,
        "tokens_spent": spent["test"],
        "baseline_tokens_added": spent["baseline"],
    }


def stop_reason(verdict: dict[str, Any], look: int, cap: str) -> str:
    """Why the sequence ended where it did, in a few words."""
    if verdict.get("identical"):
        return "no effect: identical to baseline"
    if verdict["status"] != "inconclusive":
        return f"decided in round {look + 1}"
    return cap


def run_round(
    store: Store,
    state: State,
    test_run: str,
    launcher: InProcess | Slurm,
    test_jobs: list[Job],
    seeds: int,
    stopped: Callable[[], bool],
) -> tuple[State, dict[int, JobResult], int]:
    """One round as one job array: the test's jobs, and the baseline seeds below `seeds` that
    this controller claimed (others' claims are waited for: tests running at once share the
    added baseline seeds). Returns the refreshed state, {seed: result} of the test's jobs and
    the tokens of the baseline jobs run here."""
    ran: dict[int, JobResult] = {}
    baseline_tokens = 0
    while True:
        missing = [s for s in range(seeds) if state.baseline_run(s) is None]
        mine = [s for s in missing if claim_baseline_seed(store, state, s)]
        jobs = [Job(baseline_seed_config(store, state, s), group="baseline") for s in mine]
        jobs += test_jobs
        if jobs:
            outcomes = launcher.run(jobs, lambda ids: slurm_jobs(store, test_run, ids))
            failed = [o.reason for o in outcomes if isinstance(o, Failed)]
            if failed:
                raise JobsFailed("; ".join(failed))
            for job, outcome in zip(jobs, outcomes, strict=True):
                if not isinstance(outcome, JobResult):
                    continue  # skipped: its group was stopped early
                if job.group == "baseline":
                    key = baseline_seed_key(state.baseline["config_hash"], job.seed)
                    store.once(state.run_id, key, outcome.run_id)
                    baseline_tokens += outcome.trained(state.unit)
                else:
                    ran[job.seed] = outcome
        test_jobs = []
        state = store.refresh(state)
        if stopped() or all(state.baseline_run(s) is not None for s in range(seeds)):
            return state, ran, baseline_tokens  # stopped early: the rest is not needed
        time.sleep(BASELINE_POLL_S)  # another test is recording them


BASELINE_POLL_S = 5.0


def slurm_jobs(store: Store, run_id: str, ids: list[str]) -> None:
    """Add a round's Slurm job ids to the run's `slurm.jobs` (status shows their states)."""
    before = store.run(run_id).data.tags.get("slurm.jobs", "")
    store.tag(run_id, {"slurm.jobs": ",".join([*filter(None, before.split(",")), *ids])})


def finished_seeds(store: Store, test_run: str) -> dict[int, JobResult]:
    """{seed: result} of the seed jobs below `test_run` that ran to their end."""
    found = {}
    for run in store.seed_runs(test_run):
        result = result_of(run)
        if result.status in ("completed", "diverged"):
            found[int(run.data.tags["hyprun.seed"])] = result
    return found


def seed_configs(
    store: Store,
    state: State,
    delta: tuple[str, ...] | list[str],
    parent: str,
    label: str,
    variable: Delta | str,
    seeds: int | None = None,
) -> list[DictConfig]:
    """The baseline's seeds (or `seeds` of them) with `delta` on top, recording below `parent`
    (tagged so the runs table filters seed runs by variable and delta too)."""
    app = app_of(state)
    tags = {
        "hyprun.role": "test-seed",
        "hyprun.investigation": state.name,
        "hyprun.variable": variable.variable if isinstance(variable, Delta) else variable,
        "hyprun.delta": json.dumps(list(delta)),
        ARM: f"{label} {' '.join(delta)}",
    }
    count = state.baseline["seeds"] if seeds is None else seeds
    return [
        job_config(
            store,
            [*state.baseline["overrides"], *delta],
            seed,
            parent,
            f"{label} · seed {seed}",
            tags,
            app,
        )
        for seed in range(count)
    ]
