"""The controller: baselines, one-variable hypothesis tests, verdicts, strikes and escalation.

    hyprun baseline [overrides]          k seeds of the user's config + L0 checks + triage
    hyprun test CARD | OVERRIDE... --why one variable, the baseline's seeds, a noise-aware verdict
    hyprun status                        the investigation as its MLflow runs describe it

Jobs run in this process, one after another (importing torch and DeepSpeed costs seconds per
process; a tiny job takes about as long), or on Slurm with `hydra/launcher=slurm_cpu|slurm_8xa100`
among the baseline's overrides: then all seeds run at once, and every test of the investigation
runs where its baseline ran (runner/launch/launchers.py).

What a strike is. A test is a proposed fix; a *strike* is a failed one: a test whose verdict is
`rejected` (worse than the baseline, short of the card's minimum effect, a guard regressed,
stopped early, or diverged, before its first evaluation too). `inconclusive`, `error` (jobs
crashed or were cancelled: no evidence) and refusals are not strikes. Strikes count the
current run of failed fixes, in test-number (claim) order: the rejected tests since the last
human `reset` that come after the last `confirmed` test. A confirmed test ends a run: it is
offered for promotion at once (`hyprun verify H<n> --promote`), and three rejections after it
start the count again from one. Three strikes in a row escalate: the method reads three failed
fixes in a row as a question about the architecture, the data or the recipe, for a human.

The investigation's invariants (tests/test_invariants.py checks them with generated input
against the real CLI and a real store):

1. Bad input is refused before anything is written: the overrides, the composed config and
   the job it describes (`preflight_test`: values, batch geometry, model, optimizer and
   schedule built as the job builds them) are checked before a test takes its number. A
   refusal is one line, exit code 2 (3 when escalated), and adds no run, param or tag.
2. A valid test is never refused because of earlier bad input: refused input leaves nothing
   behind that a later test could trip on.
3. Exit codes are 0 (a verdict), 1 (the test ended `error`), 2 (refused), 3 (escalated) and
   75 (interrupted, rerun to resume); nothing else, and no traceback.
4. No test run stays RUNNING without a live controller: a fault inside a claimed test ends
   it `error`; a controller killed outright leaves it to the same command's rerun, which
   resumes it (`orphaned`).
5. Strikes are derived, never counted: they equal the tests tagged `hyprun.strike=true` in
   the current run of failures (above), and the investigation is escalated exactly when
   they reach three, until a human reset.
6. Every decided test, early-rejected too, carries its verdict's numbers as metrics
   (`effect/<metric>`, `noise/<metric>`, both sides' means and spreads; effect and noise NaN
   where a diverged test has none), written in one place (`aggregates`), so the runs table
   sorted by effect lists every test.
7. A group switch changes one variable or is declared compound by its card (one_variable.py),
   and a compound test is labelled so (`hyprun.compound`) in its run name, status and report.
"""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape

from hyprun.diag.effect import change, describe, metric_key
from hyprun.diag.metric import MetricSpec
from hyprun.diag.sequential import Design, plan
from hyprun.diag.verdict import compare, load_params
from hyprun.hypotheses.schema import Card, load_cards, override_key
from hyprun.runner import markdown, provenance
from hyprun.runner.compose import compose, one_line
from hyprun.runner.control.early import EarlyRejection, seed_curves
from hyprun.runner.control.fixed import card_keys, finding_cards
from hyprun.runner.control.notify import notify
from hyprun.runner.control.one_variable import Delta, measure
from hyprun.runner.errors import BadInput, JobsFailed
from hyprun.runner.job.checkpoint import config_hash
from hyprun.runner.job.result import JobResult
from hyprun.runner.job.validate import reachable, validate
from hyprun.runner.launch.app import HydraApp
from hyprun.runner.launch.launchers import (
    Failed,
    InProcess,
    Job,
    Slurm,
    budget_of,
    cancel_active,
    launcher_for,
    result_of,
    safe_name,
    split,
)
from hyprun.runner.store.investigation import (
    ARM,
    STRIKES,
    State,
    Store,
    Test,
    baseline_claim_key,
    baseline_seed_key,
    findings_lines,
    save_views,
)

EXIT_ESCALATED = 3
DEFAULT_PRIMARY = MetricSpec("eval/loss", "min", 0.01)
console = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass
class Outcome:
    """What one `test` decided, for the CLI and the demo."""

    exit_code: int
    test: str | None = None
    verdict: dict[str, Any] | None = None


def drift_key(overrides: list[str], app: HydraApp | None = None) -> str:
    """The config hash a baseline is recorded under (bookkeeping keys excluded)."""
    if app is not None:
        return app.drift_key(overrides)
    return config_hash(compose(overrides), exclude=("checkpoint", "tracking"))


def app_of(state: State) -> HydraApp | None:
    """The user's app an investigation's baseline ran, or None for our own job."""
    record = (state.baseline or {}).get("app")
    return HydraApp.from_record(record) if record else None


def code_version(app: HydraApp | None) -> str:
    """The git commit of the code under test: the app's checkout, or hyprun's."""
    return app.git_sha() if app is not None else provenance.git_state()[0]


def job_config(
    store: Store,
    overrides: list[str],
    seed: int,
    parent: str,
    name: str,
    tags: dict,
    app: HydraApp | None = None,
) -> DictConfig:
    """One seed's job, recording into the investigation's store below `parent`."""
    if app is not None:
        return app.job_config(store.uri, store.experiment, overrides, seed, parent, name, tags)
    cfg = compose([*overrides, f"budget.seed={seed}"])
    validate(cfg)
    cfg.tracking.uri, cfg.tracking.experiment = store.uri, store.experiment
    cfg.tracking.parent_run_id = parent
    cfg.tracking.run_name = name
    cfg.tracking.tags = {**tags, "hyprun.seed": str(seed)}
    return cfg


def record_baseline(
    store: Store,
    name: str,
    overrides: list[str],
    seeds: int,
    why: str,
    app: HydraApp | None = None,
) -> State:
    """Run the baseline's seeds as children of a new investigation, then triage seed 0.
    `app`: a user's Hydra app instead of our own job."""
    from hyprun.runner.control.diagnose import diagnose

    if seeds < 1:
        raise BadInput(f"--seeds {seeds}: a baseline needs at least one seed (3 measure noise)")
    overrides, launcher_overrides = split(overrides)
    if app is not None:  # refuse bad input before the investigation exists
        app.check(overrides)
    else:
        cfg = compose(overrides)
        validate(cfg)  # the quick refusals first, before torch's import
        from hyprun.runner.job.train import preflight  # as its seed jobs will check it

        preflight(cfg, build_data=True)
    reachable(store.uri)
    launcher = launcher_for(launcher_overrides, *_slurm_names(name, "baseline"))
    parent = store.create(name, f"Baseline: {' '.join(overrides) or 'defaults'}. {why}".strip())
    tags = {"hyprun.role": "baseline", "hyprun.investigation": name, ARM: "baseline"}
    jobs = [
        Job(job_config(store, overrides, seed, parent, f"baseline · seed {seed}", tags, app))
        for seed in range(seeds)
    ]
    try:
        results = run_jobs(store, parent, launcher, jobs)
    except JobsFailed as error:
        store.tag(parent, {"hyprun.baseline_error": str(error)[:4000]})
        store.finish(parent, "FAILED")
        raise
    baseline = {
        "overrides": overrides,
        "launcher": launcher_overrides,
        "seeds": seeds,
        "config_hash": drift_key(overrides, app),
        "git_sha": code_version(app),
        "seed_runs": [r.run_id for r in results],
        **({"app": app.record(), "source": app.source_digest()} if app is not None else {}),
    }
    store.tag(parent, {"hyprun.baseline": json.dumps(baseline), "hyprun.why": why})
    noisy = (*NOISE_METRICS, app.metric().metric) if app is not None else NOISE_METRICS
    store.metrics(parent, seed_noise(store, baseline["seed_runs"], noisy))
    _, document = diagnose(store.uri, results[0].run_id, store.experiment)
    store.text(parent, json.dumps(document, indent=2, default=str), "diagnosis.json")
    findings = top_findings(document, load_cards())
    store.tag(
        parent, {"hyprun.findings": json.dumps(findings), "hyprun.question": _question(document)}
    )
    return settle(store, store.find(name))  # recorded; tests still join it, the UI shows it done


TOP_FINDINGS = 3


def top_findings(document: dict[str, Any], cards: dict[str, Card]) -> list[dict[str, Any]]:
    """Triage's top findings as the investigation keeps them (a parent-run tag): what each
    says, and the cards and config keys that would test it."""
    found = []
    for finding in document.get("findings", [])[:TOP_FINDINGS]:
        testing = finding_cards(finding, cards)
        variables = card_keys(testing, cards)
        if "deltas" in finding:  # a user's app: the cards that apply to it, in its keys
            testing = finding["cards"]
            variables = sorted({override_key(o) for d in finding["deltas"].values() for o in d})
        found.append(
            {
                "id": finding["id"],
                "cause": str(finding.get("cause", ""))[:300],
                "first_action": str(finding.get("first_action", ""))[:300],
                "cards": testing,
                "variables": variables,
            }
        )
    return found


def _question(document: dict[str, Any]) -> str:
    return str(document.get("question") or "none")


def settle(store: Store, state: State) -> State:
    """The parent run follows the investigation, not its baseline: its description says where
    it stands, its name the outcome, and it is running while a test runs and ends (end time:
    now) when none does. Its saved views follow it too (their charts' ranges fit its curves)."""
    state = store.refresh(state)
    save_views(store, state)
    store.note(state.run_id, summary(state))
    store.rename(state.run_id, f"{state.name} · {headline(state)}")
    if not any(t.verdict == "running" for t in state.tests):
        store.finish(state.run_id)
    return state


def headline(state: State) -> str:
    """The investigation at a glance, as it stands now: its escalation (even after an earlier
    fix: three rejections since are the latest word), or its fix, or its strikes so far."""
    if state.escalated:
        since = f" since H{state.confirmed[-1].number}'s fix" if state.confirmed else ""
        return f"escalated after {state.strikes} rejections{since}"
    if state.confirmed:
        fix = state.confirmed[-1]
        since = f"; {state.strikes}/{STRIKES} strikes since" if state.strikes else ""
        effect = fix.tags.get("hyprun.effect", "")
        return f"fixed by H{fix.number} {' '.join(fix.fix)} ({effect}){since}"
    running = sum(t.verdict == "running" for t in state.tests)
    done = f"{len(state.tests) - running} tested, {state.strikes}/{STRIKES} strikes"
    return done + (f", {running} running" if running else "")


def run_jobs(
    store: Store, owner: str, launcher: InProcess | Slurm, jobs: list[Job]
) -> list[JobResult]:
    """Run the jobs; their Slurm ids go on the `owner` run; any failure fails them all."""
    outcomes = launcher.run(jobs, lambda ids: store.tag(owner, {"slurm.jobs": ",".join(ids)}))
    failed = [o.reason for o in outcomes if isinstance(o, Failed)]
    if failed:
        raise JobsFailed("; ".join(failed))
    return [o for o in outcomes if isinstance(o, JobResult)]


def _slurm_names(investigation: str, what: str) -> tuple[Path, str]:
    """(submitit's folder, the job name) of an investigation's jobs."""
    return Path(".hyprun/slurm") / safe_name(investigation), f"hyprun-{investigation}-{what}"


HARDWARE_KEYS = ("nodes", "tasks_per_node", "gpus_per_node", "gres", "constraint")


def where_tests_run(state: State, given: list[str], what: str) -> InProcess | Slurm:
    """Tests run where the baseline ran: hardware is a controlled variable. Queue settings
    (partition, time limit, ...) may differ."""
    recorded = state.baseline.get("launcher", [])
    group = [o for o in given if o.startswith("hydra/launcher=")]
    resources = [o for o in given if o.split("=")[0].rsplit(".", 1)[-1] in HARDWARE_KEYS]
    if (group and group[0] not in recorded) or resources:
        where = " ".join(recorded) or "in this process"
        raise BadInput(
            f"the baseline ran {where}: a test on other hardware is not controlled; "
            "drop the launcher override or record a new baseline there"
        )
    return launcher_for([*recorded, *given], *_slurm_names(state.name, what))


NOISE_METRICS = ("eval/loss", "train/loss", "perf/tokens_per_s")


def seed_noise(
    store: Store, run_ids: list[str], metrics: tuple[str, ...] = NOISE_METRICS
) -> dict[str, float]:
    """Mean and seed-to-seed std of each headline metric's last value, for the parent run."""
    import statistics

    found = {}
    for metric in metrics:
        # A diverged seed (NaN/inf) has no spread to measure; the triage reports it instead.
        last = [
            h[-1][1] for r in run_ids if (h := store.history(r, metric)) if math.isfinite(h[-1][1])
        ]
        if len(last) >= 2:
            name = metric.replace("/", "_")
            found[f"baseline/{name}_mean"] = statistics.fmean(last)
            found[f"baseline/{name}_std"] = statistics.stdev(last)
    return found


def choose(
    argument: list[str],
    cards: dict[str, Card],
    app: HydraApp | None = None,
    baseline_overrides: list[str] | None = None,
) -> tuple[Card | None, list[str]]:
    """A card id (its delta; for a user's app, in the app's keys: runner/launch/knobs.py), or
    overrides."""
    if len(argument) == 1 and "=" not in argument[0] and not argument[0].startswith("~"):
        card = cards.get(argument[0])
        if card is None:
            raise BadInput(
                f"no hypothesis card {argument[0]!r}: name a card in hypotheses/ "
                "or give overrides such as optim.lr=3e-4"
            )
        if app is None:
            return card, list(card.delta)
        translated = app.translate(card, baseline_overrides or [])
        if translated.reason:
            raise BadInput(
                f"card {card.id} ({' '.join(card.delta)}) does not apply to {app.target}: "
                f"{translated.reason} ({app.declared_in})"
            )
        if translated.noop:  # a key the app leaves to its library's default, already the card's
            raise BadInput(
                f"card {card.id} ({' '.join(translated.overrides)}) changes nothing: "
                f"{translated.noop}; a hypothesis must change one variable"
            )
        return card, list(translated.overrides)
    return None, list(argument)


def check_drift(state: State) -> None:
    """A test is only controlled if code and config are those the baseline ran with."""
    app = app_of(state)
    sha = code_version(app)
    recorded = state.baseline
    if recorded["git_sha"] != sha:
        raise BadInput(
            f"the code changed since the baseline (git {recorded['git_sha'][:10]} -> {sha[:10]}): "
            "comparing across that is not a controlled test; record a new baseline"
        )
    source = recorded.get("source")  # an app's files, git or not (baselines before: none)
    now = app.source_digest() if app is not None and source else None
    if now is not None and now["hash"] != source["hash"]:
        raise BadInput(
            f"the app's code changed since the baseline ({provenance.source_changes(source, now)} "
            f"under {Path(app.source).parent}): comparing across that is not a controlled test; "
            "revert the change, or record a new baseline"
        )
    if drift_key(recorded["overrides"], app) != recorded["config_hash"]:
        raise BadInput(
            "the configs changed since the baseline (its composed config hashes differently): "
            "record a new baseline"
        )


def admit(state: State, number: float = math.inf) -> None:
    """Refused unless fewer than three tests of the current run of failures, numbered ahead of
    `number`, could still become strikes (rejected, or running): more could escalate the
    investigation before this test's verdict counts."""
    ahead = [
        t for t in state.counted if 0 < t.number < number and t.verdict in ("running", "rejected")
    ]
    if len(ahead) >= STRIKES:
        code = EXIT_ESCALATED if state.escalated else BadInput.exit_code
        raise Refused(
            code,
            f"{len(ahead)} tests ahead could still take the last strikes: "
            "wait for them ('hyprun status')",
        )


def claim(store: Store, state: State, delta: Delta, card: Card | None, why: str) -> tuple[str, int]:
    """Create the test's run, take its number, then count: a test only runs if, among the tests
    that could still become strikes, fewer than the strikes left hold a lower number. Numbers are
    taken once each (`Store.number`), so two commands started together agree on their order.
    The count runs first without a claim, so a refusal writes nothing; only a lost race (another
    command claimed in between) leaves this test's run, ended `refused` (KILLED)."""
    admit(state)
    compound = {"hyprun.compound": ",".join(delta.compound)} if delta.compound else {}
    run_id = store.child(
        state.run_id,
        f"{delta.describe()} · claiming",
        {
            "hyprun.role": "test",
            "hyprun.investigation": state.name,
            "hyprun.delta": json.dumps(list(delta.overrides)),
            "hyprun.variable": delta.variable,
            "hyprun.card": card.id if card else "",
            "hyprun.verdict": "running",
            "hyprun.why": why,
            "hyprun.claimed_ms": str(int(time.time() * 1000)),
            "hyprun.controller": controller_id(),
            **compound,
        },
    )
    store.params(run_id, changed_params(delta))
    number = store.number(state, run_id)
    store.tag(run_id, {"hyprun.number": str(number)})
    store.rename(run_id, f"H{number} {delta.describe()} · running")
    try:
        admit(store.refresh(state), number)
    except Refused:
        store.tag(run_id, {"hyprun.verdict": "refused"})
        store.finish(run_id, "KILLED")
        raise
    store.reopen(state.run_id)  # the investigation runs again while its test does
    return run_id, number


def changed_params(delta: Delta) -> dict[str, str]:
    """The test run's params: only what it changes, and from what. MLflow's compare view of
    test runs then shows exactly the one difference (every seed run has the full config)."""
    params = {"variable": delta.variable}
    for key, (before, after) in list(delta.changes.items())[:100]:
        params[key] = str(after)
        params[f"baseline.{key}"] = str(before)
    return params


class Refused(Exception):
    def __init__(self, exit_code: int, message: str):
        super().__init__(message)
        self.exit_code = exit_code


def open_test(store: Store, name: str | None, why: str) -> State:
    """The investigation a new test joins, once it may take one (Refused when escalated)."""
    state = store.find(name)
    if state.escalated:
        raise Refused(EXIT_ESCALATED, escalated_note(state))
    if state.baseline is None:
        raise BadInput(f"investigation {state.name!r} has no baseline: run 'hyprun baseline' first")
    if not why.strip():
        raise BadInput("--why is empty: say 'I think [cause] because [evidence]'")
    check_drift(state)
    return state


def escalated_note(state: State) -> str:
    """What a user who hit the last strike needs in one line: which investigation, which tests
    struck, where the escalation report is, and the two ways on."""
    struck = ", ".join(f"H{t.number}" for t in state.counted if t.strike)
    return (
        f"investigation {state.name!r} is escalated: {state.strikes} rejected hypotheses in a "
        f"row ({struck}). Read its escalation report, escalation.md on MLflow run "
        f"{state.run_id} (hyprun status --investigation {state.name} prints where); then a "
        f"human decides: 'hyprun reset --investigation {state.name} --by NAME --reason TEXT' "
        "to go on testing, or a new investigation with 'hyprun baseline'"
    )


def refuse_repeat(state: State, overrides: list[str]) -> None:
    earlier = state.tested(overrides)
    if earlier is not None:
        raise BadInput(
            f"{' '.join(overrides)} was tested already as H{earlier.number}: "
            f"{earlier.verdict} (run {earlier.run_id})"
        )


def refusals_as_outcomes(command: Callable[..., Outcome]) -> Callable[..., Outcome]:
    """A refusal (escalated, no strikes left) ends the command with its exit code, said once."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Outcome:
        try:
            return command(*args, **kwargs)
        except Refused as refused:
            console.print(f"hyprun: {one_line(refused)}", markup=False)
            return Outcome(refused.exit_code)

    return run


@refusals_as_outcomes
def test(
    store: Store,
    name: str | None,
    argument: list[str],
    why: str,
    max_seeds: int | None = None,
    max_tokens: int = 0,
) -> Outcome:
    """Test one hypothesis against the investigation's baseline, in rounds of seeds until it is
    decided or a cap is reached (`max_seeds` per side, `max_tokens` trained by the test; None
    and 0: the table's seed cap, no token cap)."""
    state = open_test(store, name, why)
    argument, launcher_overrides = split(argument)
    baseline_overrides = state.baseline["overrides"]
    app = app_of(state)
    card, overrides = choose(argument, load_cards(), app, baseline_overrides)
    delta = measure(baseline_overrides, overrides, app, compound=bool(card and card.compound))
    preflight_test(baseline_overrides, delta, app)  # bad input refused before anything is written
    design, cap = test_design(store, state, max_seeds, max_tokens)
    launcher = where_tests_run(state, launcher_overrides, f"H{len(state.tests) + 1}")
    earlier = state.tested(list(delta.overrides))
    if earlier is not None and orphaned(earlier):  # the same command again, after a crash
        test_run, number = earlier.run_id, earlier.number
        store.tag(test_run, {"hyprun.controller": controller_id()})
        if not number:  # killed while taking its number
            number = store.number(state, test_run)
            store.tag(test_run, {"hyprun.number": str(number)})
        store.reopen(state.run_id)
        cancel_active(earlier.tags.get("slurm.jobs", ""))  # they checkpoint; resubmitted below
        console.print(f"H{number}: resuming the test a crashed controller left running")
    else:
        refuse_repeat(state, list(delta.overrides))
        test_run, number = claim(store, state, delta, card, why)
    label = f"H{number} {delta.describe()}"
    try:
        return run_test(store, state, test_run, number, label, delta, card, launcher, (design, cap))
    except Exception as error:  # a fault of ours, not evidence: the test ends, no strike
        if store.run(test_run).info.status != "RUNNING":
            raise
        return record_error(store, test_run, label, error)


def preflight_test(
    baseline_overrides: list[str], delta: Delta, app: HydraApp | None = None
) -> None:
    """The test's composed job checked as its seed jobs will check it (validate(), the batch
    geometry, the model, optimizer and schedule built without training), before a claim. A
    user's app: its overrides against its baseline's config and its own preflight
    (HydraApp.refuse)."""
    if app is not None:
        app.refuse(baseline_overrides, delta.overrides)
        return
    from hyprun.runner.job.train import preflight  # torch: only once a test is about to run

    cfg = compose([*baseline_overrides, *delta.overrides])
    preflight(cfg, build_data=any(key.startswith("data.") for key in delta.changes))


def run_test(
    store: Store,
    state: State,
    test_run: str,
    number: int,
    label: str,
    delta: Delta,
    card: Card | None,
    launcher: InProcess | Slurm,
    rounds: tuple[Design, str],
) -> Outcome:
    """Run a claimed test's seeds and record its verdict."""
    app = app_of(state)
    primary = card.primary if card else DEFAULT_PRIMARY
    guards = list(card.guards) if card else []
    if app is not None:  # the app's declared metric stands in for our eval/loss
        primary = app.metric(card.primary if card else None)
        guards = [app.metric(g) for g in guards]
    try:
        verdict = in_rounds(store, state, test_run, label, delta, launcher, rounds, primary, guards)
    except Exception as error:  # jobs failed, or nothing to compare (ValueError): no strike
        return record_error(store, test_run, label, error)
    extra = {"hyprun.claimed": card.claimed.effect} if card and card.claimed else {}
    return record_verdict(store, state, test_run, label, verdict, extra)


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


def claim_baseline_seed(store: Store, state: State, seed: int) -> bool:
    """Take the job of recording baseline seed `seed` (True), unless another live controller
    holds it. A claim whose controller died on this host without recording the seed is taken
    over at the next attempt number; the job then resumes from that controller's checkpoint."""
    me = f"{controller_id()}:{uuid.uuid4().hex[:8]}"
    attempt = 0
    while True:
        key = baseline_claim_key(state.baseline["config_hash"], seed, attempt)
        if store.once(state.run_id, key, me):
            return True
        holder = store.run(state.run_id).data.params.get(key, "")
        if not process_gone(holder.rsplit(":", 1)[0]):
            return False
        attempt += 1


def baseline_seed_config(store: Store, state: State, seed: int) -> DictConfig:
    """A baseline seed added after `hyprun baseline`: the baseline's config, recorded below the
    investigation as its other seeds are (the same config whoever runs it, so a takeover
    resumes the same MLflow run from its checkpoint)."""
    tags = {"hyprun.role": "baseline", "hyprun.investigation": state.name}
    name = f"baseline · seed {seed}"
    overrides = state.baseline["overrides"]
    return job_config(store, overrides, seed, state.run_id, name, tags, app_of(state))


def controller_id() -> str:
    """Who runs a test: host and process, so a rerun can tell a crashed controller's test."""
    return f"{socket.gethostname()}:{os.getpid()}"


def orphaned(test: Test) -> bool:
    """A test still `running` whose controller process on this host is gone (kill -9, a
    crash, a closed terminal). Another host's controller cannot be checked: not orphaned."""
    return test.verdict == "running" and process_gone(test.tags.get("hyprun.controller", ""))


def process_gone(controller: str) -> bool:
    """Whether the controller `host:pid` is a process of this host that no longer runs."""
    host, _, pid = controller.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


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


def record_error(store: Store, test_run: str, label: str, error: BaseException) -> Outcome:
    """Jobs that failed are no evidence: the test ends as `error`, not a strike."""
    store.tag(test_run, {"hyprun.verdict": "error", "hyprun.reason": str(error)[:4000]})
    store.rename(test_run, f"{label} · error")
    store.finish(test_run, "FAILED")
    parent = store.run(store.run(test_run).data.tags["mlflow.parentRunId"])
    settle(store, store.state(parent))
    console.print(escape(f"{label}: error ({one_line(error)}); not a strike"))
    return Outcome(1, label.split()[0], {"status": "error"})


VERDICT_NUMBERS = {  # verdict field -> metric name prefix; the primary metric is the suffix
    "noise": "noise",
    "test_value": "test_mean",
    "test_sigma": "test_std",
    "baseline_value": "baseline_mean",
    "baseline_sigma": "baseline_std",
}


HEADLINE = ("effect", "noise")
"""Metric prefixes logged on every decided test run (NaN where a diverged test has none)."""


def aggregates(verdict: dict[str, Any]) -> dict[str, float]:
    """The verdict's numbers as metrics of the test run, named for what they measure:
    `effect/eval_loss` (relative change, sign as measured: diag/effect.py), `noise/eval_loss`,
    `test_mean/eval_loss`, ... One primary metric per column, so a sort never mixes units.
    Effect and noise are logged on every decided test, NaN where a diverged one has none, so
    the runs table sorted by effect lists every test."""
    key = metric_key(verdict.get("metric") or DEFAULT_PRIMARY.metric)
    found = {}
    for guard in verdict.get("guards") or []:  # a guard's own column: it may have decided
        guard_key = metric_key(guard["metric"])
        found[f"effect/{guard_key}"] = change(
            {"baseline_value": guard.get("baseline"), "test_value": guard.get("test")}
        )
        found[f"noise/{guard_key}"] = guard.get("noise")
    found[f"effect/{key}"] = change(verdict)
    found |= {f"{prefix}/{key}": verdict.get(field) for field, prefix in VERDICT_NUMBERS.items()}
    found["tokens_saved_frac"] = verdict.get("tokens_saved")
    numbers = {
        name: float(value)
        for name, value in found.items()
        if isinstance(value, int | float) and math.isfinite(value)
    }
    return {**{f"{name}/{key}": math.nan for name in HEADLINE}, **numbers}


def rounds_tags(verdict: dict[str, Any]) -> dict[str, str]:
    """How many seeds per side the test's last look planned, how many of its seeds trained (an
    early rejection stops before the rest start) and why it stopped (status and report show
    them: `Test.seeds_shown`)."""
    if "seeds" not in verdict:
        return {}
    return {
        "hyprun.seeds": str(verdict["seeds"]),
        "hyprun.seeds_run": str(verdict.get("seeds_run", verdict["seeds"])),
        "hyprun.stopped": verdict["stopped"],
    }


def spent_tags(verdict: dict[str, Any]) -> dict[str, str]:
    """What the test's own seeds trained, in its metric's unit, and the share of the plan an
    early stop saved (`hyprun.spent`, a column of status)."""
    if "tokens_spent" not in verdict:
        return {}
    text = f"{int(verdict['tokens_spent']):,} {verdict.get('unit') or 'tokens'}"
    if verdict.get("trials"):  # a sweep: the other trials' seeds are in the report's total
        text += " on the best trial"
    saved = verdict.get("tokens_saved")
    if isinstance(saved, float) and saved > 0:
        text += f" ({saved:.0%} saved)"
    return {"hyprun.spent": text}


def run_name(label: str, verdict: dict[str, Any]) -> str:
    """`H1 optim.lr 1e-05→0.001 · confirmed · eval/loss −3.2% ± 0.2%`: the runs table answers
    which fix worked, by how much and against what noise, without a column added."""
    return f"{label} · {verdict['status']} · {describe(verdict)}"


def arm_name(label: str, verdict: dict[str, Any]) -> str:
    """`H1 confirmed`: a test's side in the comparison view, as its charts' legend names it.
    MLflow's legend is two lines tall; short names fit every side in them, where full run names
    took a line each and cut the legend after H1 (the test run's name keeps delta and effect)."""
    return f"{label.split()[0]} {verdict['status']}"


def record_verdict(
    store: Store,
    state: State,
    test_run: str,
    label: str,
    verdict: dict[str, Any],
    extra: dict[str, str],
) -> Outcome:
    """Write a test's verdict on its run, update the investigation, escalate on the last strike."""
    verdict = {**verdict, "unit": state.unit}  # what its `tokens` count: an app's may be steps
    store.tag(
        test_run,
        {
            "hyprun.verdict": verdict["status"],
            "hyprun.strike": str(verdict["status"] == "rejected").lower(),
            "hyprun.reason": verdict["reason"],
            "hyprun.effect": describe(verdict),
            "hyprun.early": str(bool(verdict.get("early"))).lower(),
            **rounds_tags(verdict),
            **spent_tags(verdict),
            **extra,
        },
    )
    store.metrics(test_run, aggregates(verdict), step=verdict.get("tokens") or 0)
    shown = {**verdict, "change": change(verdict), "shown": describe(verdict)}
    store.text(test_run, json.dumps(shown, indent=2, default=str), "verdict.json")
    store.rename(test_run, run_name(label, verdict))
    for seed_run in store.seed_runs(test_run):  # the seed band is labelled with the outcome
        store.tag(seed_run.info.run_id, {ARM: arm_name(label, verdict)})
    store.finish(test_run)
    state = settle(store, state)
    console.print(escape(f"{run_name(label, verdict)} — {verdict['reason']}"))
    if verdict["status"] == "confirmed":
        number = label.split()[0]
        console.print(
            f"{number} ends the run of failed fixes; make it the baseline with "
            f"'hyprun verify {number} --promote'"
        )
    if state.escalated:
        escalate(store, state)
    return Outcome(0, label.split()[0], verdict)


def decide(
    store: Store,
    state: State,
    results: list[JobResult],
    primary: MetricSpec,
    guards: list[MetricSpec],
    looks: int = 1,
    baseline_runs: list[str] | None = None,
    design: Design | None = None,
) -> dict[str, Any]:
    """The verdict at matched tokens, from the seed runs' histories in MLflow; `looks`: the
    test is the best of that many (a sweep); `baseline_runs`: the baseline seeds of this look
    (default: those recorded with the baseline); `design`: the test's sequential design."""
    metrics = [primary, *guards]
    baseline_runs = baseline_runs or state.baseline["seed_runs"]
    base = {m.metric: seed_curves(store, baseline_runs, m.metric) for m in metrics}
    test_runs = [r.run_id for r in results]
    ours = {m.metric: seed_curves(store, test_runs, m.metric) for m in metrics}
    diverged = any(r.status == "diverged" for r in results)
    diverged_early(store, results, ours[primary.metric])
    blown = [
        int(run.data.tags.get("hyprun.seed", "0"))
        for run in map(store.run, baseline_runs)
        if run.data.tags.get("hyprun.outcome") == "diverged"
    ]
    verdict = compare(
        base[primary.metric],
        ours[primary.metric],
        primary,
        guards=guards,
        baseline_guards=base,
        test_guards=ours,
        diverged=diverged,
        baseline_diverged=blown,
        looks=looks,
        design=design,
        unit=state.unit,
    )
    return verdict.to_dict()


def diverged_early(
    store: Store, results: list[JobResult], curves: dict[int, list[tuple[int, float]]]
) -> None:
    """A seed that diverged before its first evaluation has no point to compare; its job
    recorded the token count where the loss became NaN/inf. That mark goes in as NaN, so the
    verdict is `rejected — diverged` (a failed fix, a strike), not an error."""
    for result in results:
        if result.status != "diverged":
            continue
        seed = int(store.run(result.run_id).data.tags.get("hyprun.seed", "0"))
        points = curves.get(seed, [])
        if not any(math.isfinite(value) for _, value in points):
            curves[seed] = [*points, (result.tokens, math.nan)]


def escalate(store: Store, state: State) -> None:
    """Three strikes: stop, and hand a human the evidence and the fundamental questions.

    Tests finishing together may all see the last strike: the first to claim the escalation
    writes the report and sends the notice, once."""
    console.print(
        f"[bold red]Escalated[/]: {state.strikes} strikes. Report: escalation.md on run "
        f"{state.run_id}; then a human decides: hyprun reset --investigation "
        f"{escape(state.name)} --by NAME --reason TEXT"
    )
    for f in state.untested:
        console.print(
            f"  triage pointed at [bold]{f['id']}[/] and no test touched it: {f['first_action']}"
        )
    me = f"{controller_id()}:{uuid.uuid4().hex[:8]}"  # threads of one process differ too
    if not store.once(state.run_id, f"escalation.{len(state.resets) + 1}", me):
        return
    lines = [
        f"# Escalation: investigation {state.name}",
        "",
        f"{state.strikes} hypotheses in a row were rejected. hyprun refuses further tests "
        "until a human decides "
        f"(`hyprun reset --investigation {state.name} --by NAME --reason ...`).",
        "",
        f"Baseline: `{' '.join(state.baseline['overrides']) or 'defaults'}`, "
        f"{state.baseline['seeds']} seeds, git {state.baseline['git_sha'][:10]}.",
        "",
    ]
    lines += markdown.table(
        ["test", "delta", "verdict", "effect", "measured", "claimed"],
        [
            [
                f"H{t.number}",
                f"`{' '.join(t.delta)}`" + (" (compound)" if t.compound else ""),
                t.verdict,
                t.tags.get("hyprun.effect", ""),
                t.tags.get("hyprun.reason", ""),
                t.tags.get("hyprun.claimed", ""),
            ]
            for t in state.tests
        ],
    )
    promoted = state.baseline.get("promoted_from")
    fixes = [f"H{t.number}" for t in state.confirmed if f"H{t.number}" != promoted]
    if fixes:
        lines += [
            "",
            f"Confirmed before this run of failures: {', '.join(fixes)}. Make one the baseline "
            f"with `hyprun verify {fixes[-1]} --promote` after the reset, or decide why not.",
        ]
    lines += ["", *escalation_findings(state)]
    lines += [
        "",
        "## Questions for a human",
        "- Is the architecture appropriate for this task?",
        "- Is the data sufficient in quality and quantity?",
        "- Is the training recipe (LR, batch size, optimizer) reasonable?",
        "- Is this a known-working setup being reproduced, or something new?",
    ]
    report = "\n".join(lines) + "\n"
    store.text(state.run_id, report, "escalation.md")  # recorded before anyone is told
    store.tag(state.run_id, {"hyprun.escalated": "true"})
    # An app's config has no tracking node of ours: hyprun's own defaults say whom to notify.
    tracking = compose([] if app_of(state) else state.baseline["overrides"]).tracking
    if tracking.notify_url or tracking.notify_command:
        notice = {
            "investigation": state.name,
            "run_id": state.run_id,
            "strikes": state.strikes,
            "tests": [f"H{t.number} {' '.join(t.delta)}: {t.verdict}" for t in state.tests],
            "untested_findings": [f["id"] for f in state.untested],
            "report": "escalation.md",
        }
        sent = notify(notice, tracking.notify_url, tracking.notify_command)
        store.tag(state.run_id, {"hyprun.notified": "; ".join(sent)})


def escalation_findings(state: State) -> list[str]:
    """escalation.md's section on the evidence: triage's top findings, the untouched first."""
    if not state.findings:
        return ["## What triage found", "", "No pattern fired on the baseline."]
    untested = {f["id"] for f in state.untested}
    lines = ["## What triage found, and what no test touched", ""]
    if untested:
        lines += [
            f"The evidence pointed at {', '.join(sorted(untested))}, and no test has touched "
            "it yet: start there, before another recipe tweak.",
            "",
        ]
    for rank, f in enumerate(state.findings, 1):
        tested = "**not tested yet**" if f["id"] in untested else "tested"
        cards = ", ".join(f["cards"]) or "no card"
        lines.append(
            f"{rank}. **{f['id']}** ({tested}; {cards}): {f['cause']}. "
            f"First action: {f['first_action']}"
        )
    return lines


def reset(store: Store, name: str | None, by: str, reason: str) -> State:
    """A human's decision after an escalation: recorded on the parent run, strikes start over."""
    if not by.strip() or not reason.strip():
        raise BadInput("reset needs --by NAME and --reason TEXT: the decision is recorded")
    state = store.find(name)
    now = int(time.time() * 1000)
    record = {"by": by, "reason": reason, "time": now, "strikes_before": state.strikes}
    store.tag(
        state.run_id, {f"hyprun.reset.{now}": json.dumps(record), "hyprun.escalated": "false"}
    )
    return settle(store, state)  # its run's name and description no longer say escalated


def summary(state: State) -> str:
    """The parent run's description (Markdown in the MLflow UI): where the investigation stands,
    what triage found, what no test has touched yet, and each test with its effect."""
    lines = [
        f"**Investigation {state.name}**: {state.strikes}/{STRIKES} strikes"
        + (" — ESCALATED: a human decides next" if state.escalated else ""),
        "",
        *[f"- {line}" for line in findings_lines(state)],
        "",
    ]
    for t in state.tests:
        effect = t.tags.get("hyprun.effect", "")
        early = f" (stopped early: {t.seeds_shown} seeds)" if " of " in t.seeds_shown else ""
        lines.append(
            f"- H{t.number} `{' '.join(t.delta)}`: {t.verdict}"
            + (f" · {effect}" if effect else "")
            + early
        )
    return "\n".join(lines).strip() + "\n"
