"""The `test` command: one hypothesis against the investigation's baseline, admitted or refused
(bad input, drift, strikes), then run in rounds (rounds.py) and decided (verdicts.py).

    hyprun test CARD | OVERRIDE... --why one variable, the baseline's seeds, a noise-aware verdict

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
   where a diverged test has none), written in one place (verdicts.py `aggregates`), so the
   runs table sorted by effect lists every test.
7. A group switch changes one variable or is declared compound by its card (one_variable.py),
   and a compound test is labelled so (`hyprun.compound`) in its run name, status and report.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hyprun.diag.sequential import Design
from hyprun.hypotheses.schema import Card, load_cards
from hyprun.runner import provenance
from hyprun.runner.compose import compose, one_line
from hyprun.runner.control.context import (
    DEFAULT_PRIMARY,
    Outcome,
    app_of,
    code_version,
    console,
    controller_id,
    drift_key,
    process_gone,
    where_tests_run,
)
from hyprun.runner.control.escalation import escalated_note
from hyprun.runner.control.one_variable import Delta, measure
from hyprun.runner.control.rounds import in_rounds, test_design
from hyprun.runner.control.verdicts import leak_fixed, leaks_removed, record_error, record_verdict
from hyprun.runner.errors import BadInput
from hyprun.runner.launch.app import HydraApp
from hyprun.runner.launch.launchers import InProcess, Slurm, cancel_active, split
from hyprun.runner.store.investigation import STRIKES, State, Store, Test

EXIT_ESCALATED = 3


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


def orphaned(test: Test) -> bool:
    """A test still `running` whose controller process on this host is gone (kill -9, a
    crash, a closed terminal). Another host's controller cannot be checked: not orphaned."""
    return test.verdict == "running" and process_gone(test.tags.get("hyprun.controller", ""))


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
    seeds = store.seed_runs(test_run)
    baseline = [state.baseline_run(int(run.data.tags["hyprun.seed"])) for run in seeds]
    removed = leaks_removed(store, [r for r in baseline if r], [r.info.run_id for r in seeds])
    verdict = leak_fixed(verdict, removed)
    extra = {"hyprun.claimed": card.claimed.effect} if card and card.claimed else {}
    return record_verdict(store, state, test_run, label, verdict, extra)
