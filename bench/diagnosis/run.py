"""One benchmark scenario through hyprun's method, as `hyprun demo` runs its planted fault:

record a baseline of the planted config, `diagnose` its first seed, then test the hypothesis
cards the ranked findings point to, one at a time, until one is confirmed (then `verify` it) or
the investigation escalates. A/A scenarios test no-op deltas instead of cards. Everything is
recorded in the scenario's own MLflow sqlite file; the result is a plain dict for `table.py`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hyprun.diag.triage import cause_rank

SCENARIOS = Path(__file__).with_name("scenarios.yaml")
KINDS = ("fault", "control", "aa")
EXPERIMENT = "bench-diagnosis"
DEFAULT_SEEDS = 2


@dataclass(frozen=True)
class Scenario:
    """A healthy config with one planted fault (or none), and the truth about it."""

    name: str
    kind: str
    """fault | control (a healthy config) | aa (a healthy config and no-op deltas)."""
    fault: str
    """The planted fault in words (the table's "true cause")."""
    base: tuple[str, ...]
    """Overrides of the healthy config the fault is planted in."""
    plant: tuple[str, ...]
    """Overrides that plant the fault (empty for controls)."""
    cause: tuple[str, ...]
    """Finding ids whose cause is the planted fault (any one counts)."""
    fix: tuple[str, ...]
    """Card ids that remove the fault (empty: no card does; nothing must be confirmed)."""
    aa: tuple[str, ...] = ()
    """For kind aa: deltas that change the data sample, not the task (A/A tests)."""
    exclusive: bool = False
    """Its verdict rests on throughput: run it alone, with every core, after the others."""
    seeds: int | None = None
    """Seeds for this scenario when the command line names none (default: DEFAULT_SEEDS)."""
    notes: str = ""

    @property
    def overrides(self) -> list[str]:
        return [*self.base, *self.plant]


def load_scenarios(path: Path = SCENARIOS) -> tuple[list[str], list[Scenario]]:
    """(overrides common to every scenario, the scenarios) from the YAML file."""
    data = yaml.safe_load(Path(path).read_text())
    scenarios = []
    for entry in data["scenarios"]:
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()}
        fields.setdefault("base", ())
        fields.setdefault("plant", ())
        fields.setdefault("cause", ())
        fields.setdefault("fix", ())
        scenario = Scenario(**fields)
        if scenario.kind not in KINDS:
            raise ValueError(f"scenario {scenario.name}: kind {scenario.kind!r} not in {KINDS}")
        scenarios.append(scenario)
    return list(data["common"]), scenarios


@contextlib.contextmanager
def inside(folder: Path) -> Iterator[None]:
    """Run in `folder`: MLflow's default artifact root (./mlruns) is relative to the cwd."""
    before = Path.cwd()
    folder.mkdir(parents=True, exist_ok=True)
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def run_scenario(
    scenario: Scenario,
    workdir: Path,
    seeds: int,
    common: list[str],
    max_seeds: int | None = None,
) -> dict[str, Any]:
    """The method end to end on one scenario, in `workdir`; a result dict (never raises for a
    failing scenario: the error is recorded in the result)."""
    workdir = Path(workdir).resolve()
    start = time.monotonic()
    result: dict[str, Any] = {
        "name": scenario.name,
        "kind": scenario.kind,
        "fault": scenario.fault,
        "cause": list(scenario.cause),
        "fix": list(scenario.fix),
        "seeds": seeds,
        "findings": [],
        "rank": None,
        "tests": [],
        "confirmed": None,
        "strikes": 0,
        "escalated": False,
        "tokens_spent": 0,
        "tokens_saved": 0,
        "error": None,
        "diagnosed": False,
        "exclusive": scenario.exclusive,
    }
    try:
        with inside(workdir):
            _investigate(scenario, workdir, seeds, common, result, max_seeds)
    except Exception as error:  # a broken scenario is a result too, not a crashed benchmark
        result["error"] = f"{type(error).__name__}: {error}"[:2000]
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def _investigate(
    scenario: Scenario,
    workdir: Path,
    seeds: int,
    common: list[str],
    result: dict[str, Any],
    max_seeds: int | None,
) -> None:
    from hyprun.hypotheses.schema import load_cards
    from hyprun.runner.control import controller, verify
    from hyprun.runner.control.baseline import record_baseline
    from hyprun.runner.control.diagnose import diagnose
    from hyprun.runner.errors import BadInput
    from hyprun.runner.store.investigation import Store

    store = Store(f"sqlite:///{workdir}/mlflow.db", EXPERIMENT)
    name = scenario.name
    overrides = [*common, f"checkpoint.dir={workdir}/ckpt", *scenario.overrides]
    result["budget_tokens"] = int(_composed(overrides).budget.tokens)
    try:
        state = record_baseline(store, name, overrides, seeds, scenario.fault)
    except Exception as error:
        # `hyprun baseline` failed: that is the verdict. Its seed runs may still be recorded,
        # and a user would still run `hyprun diagnose` on one, so triage is measured anyway.
        result["error"] = f"baseline: {type(error).__name__}: {error}"[:2000]
        seed0 = _recorded_seed0(store, name)
        if seed0 is not None:
            _triage(scenario, diagnose(store.uri, seed0, store.experiment)[1], result)
        _collect(store, name, scenario, result)
        return
    _, document = diagnose(store.uri, state.baseline["seed_runs"][0], store.experiment)
    _triage(scenario, document, result)

    cards = load_cards()
    if scenario.kind == "aa":
        candidates = [
            (None, [delta], "A/A: the data sample changes, the task does not")
            for delta in scenario.aa
        ]
    else:
        # In the order `hyprun diagnose` shows them: by finding, each row's cards as listed.
        shown = dict.fromkeys(c for f in document["findings"] for c in f["cards"] if c in cards)
        candidates = [(c, [c], cards[c].statement) for c in shown]
    skipped = []
    for card_id, argument, why in candidates:
        try:
            outcome = controller.test(store, name, argument, why, max_seeds=max_seeds)
        except BadInput as refused:  # changes nothing, repeats a delta, or a controlled key
            skipped.append({"card": card_id, "reason": str(refused)})
            continue
        except Exception as error:  # `hyprun test` crashed: the scenario ends in an error
            result["error"] = f"test {card_id or argument[0]}: {type(error).__name__}: {error}"
            break
        if outcome.exit_code == controller.EXIT_ESCALATED or outcome.verdict is None:
            break
        if outcome.verdict["status"] == "confirmed":
            result["verify"] = verify.verify(store, name, outcome.test)
            break
        if store.find(name).escalated:
            break
    result["skipped"] = skipped
    _collect(store, name, scenario, result)


def _triage(scenario: Scenario, document: dict[str, Any], result: dict[str, Any]) -> None:
    """Record the ranked finding ids of a diagnosis, and where the true cause ranks among them."""
    findings = [f["id"] for f in document["findings"]]
    result.update(findings=findings, question=document["question"], diagnosed=True)
    result["rank"] = cause_rank(document["findings"], scenario.cause)


def _recorded_seed0(store, name: str) -> str | None:
    """The run id of seed 0 of a baseline that was recorded but not completed."""
    try:
        state = store.find(name)
    except Exception:
        return None
    runs = [r for r in store.seed_runs(state.run_id) if r.data.tags.get("hyprun.seed") == "0"]
    return runs[0].info.run_id if runs else None


def _collect(store, name: str, scenario: Scenario, result: dict[str, Any]) -> None:
    """Tests, verdicts, strikes and tokens as the investigation's MLflow runs record them."""
    state = store.find(name)
    seeds = result["seeds"]
    budget = result["budget_tokens"]
    spent = sum(_tokens(r) for r in store.seed_runs(state.run_id))
    saved_total, strikes = 0, 0
    for test in state.tests:
        if test.verdict == "refused":
            continue
        test_runs = store.seed_runs(test.run_id)
        test_spent = sum(_tokens(r) for r in test_runs)
        early = test.tags.get("hyprun.early") == "true"
        look_seeds = int(test.tags.get("hyprun.seeds", seeds))  # a later round plans more seeds
        saved = budget * look_seeds - test_spent if early else 0
        verdict = store.json_artifact(test.run_id, "verdict.json") or {}
        result["tests"].append(
            {
                "number": test.number,
                "card": test.card,
                "delta": test.delta,
                "verdict": test.verdict,
                "effect": _float(verdict.get("effect")),  # the improvement: + is better
                "shown": test.tags.get("hyprun.effect", ""),  # as every output prints it
                "early": early,
                "seeds": len(test_runs),
                "look_seeds": look_seeds,
                "tokens_spent": test_spent,
                "tokens_saved": saved,
                "fixes": bool(test.card and test.card in scenario.fix),
                "strikes_before": strikes,
            }
        )
        strikes += test.verdict == "rejected"
        spent += test_spent
        saved_total += saved
    confirmed = [t for t in result["tests"] if t["verdict"] == "confirmed"]
    if confirmed:
        result["confirmed"] = confirmed[0]["card"] or " ".join(confirmed[0]["delta"])
        result["strikes_to_confirm"] = confirmed[0]["strikes_before"]
    result.update(
        strikes=state.strikes,
        escalated=state.escalated,
        tokens_spent=spent,
        tokens_saved=saved_total,
    )


def _tokens(run) -> int:
    """Tokens a job trained on, from its `hyprun.tokens` tag (0 if it never got there)."""
    return int(float(run.data.tags.get("hyprun.tokens", 0)))


def _float(value: str | float | None) -> float | None:
    try:
        return float(value) if value not in (None, "", "None") else None
    except ValueError:
        return None


def _composed(overrides: list[str]):
    from hyprun.runner.compose import compose

    return compose(overrides)


def worker_setup(threads: int, sha: str) -> None:
    """One worker: `threads` torch threads, and the commit the benchmark started on.

    The controller refuses a test when the git SHA changed since its baseline; a commit landing
    in the checkout during a half-hour benchmark is not a change to the code these workers
    already imported, so the SHA is pinned to the one the benchmark reports."""
    import torch

    from hyprun.runner import provenance

    torch.set_num_threads(threads)
    provenance.git_state = lambda root=None: (sha, False)


def run_logged(
    scenario: Scenario, workdir: Path, seeds: int, common: list[str], max_seeds: int | None
) -> dict[str, Any]:
    """run_scenario with this process's stdout and stderr in workdir/log.txt."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = os.open(workdir / "log.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    return run_scenario(scenario, workdir, seeds, common, max_seeds)
