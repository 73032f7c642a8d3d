"""The investigation's invariants (runner/control/controller.py, module docstring) held under
hostile input, checked against the real `hyprun` CLI and a real sqlite MLflow store.

Property-based (the `hypothesis` library): generated overrides that must be refused (invalid
values, hostile text, group switches, controlled variables, repeats) change nothing and say one
line; a state machine interleaves them with real tests of a tiny GPT, kills of the controller at
random moments, resets and reports, checking every invariant after every step. Corner cases that
once failed are kept as explicit `@example`s. CI runs a fixed-seed (derandomized) profile, so a
failure there reproduces; `HYPOTHESIS_PROFILE=explore` searches further at random.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from mlflow.tracking import MlflowClient

from hyprun.hypotheses.schema import load_cards
from hyprun.runner.cli.main import main as hyprun
from hyprun.runner.control.baseline import record_baseline
from hyprun.runner.control.controller import choose
from hyprun.runner.control.one_variable import measure
from hyprun.runner.errors import BadInput
from hyprun.runner.store.investigation import STRIKES, Store
from tests.helpers import python_env

# CI: a fixed seed, no example database, and no shrinking (each step runs real commands): a
# failure reports the generated case as is, and rerunning reproduces it.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    phases=[Phase.explicit, Phase.generate],
)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Two seeds of 4 steps (1024 tokens each), evaluated at the end only: a test takes ~10 s, and
# a test that blows up does so before its first evaluation.
BUDGET = [
    "budget.tokens=4096",
    "budget.eval_every_tokens=4096",
    "budget.eval_sequences=16",
    "probes=off",
]
WHY = "I think [cause] because [evidence]"
EXIT_CODES = {0, 1, 2, 3, 75}
CARD_IDS = set(load_cards())


# ------------------------------------------------------------------------------ the harness


def cli(*args: str) -> tuple[int, str, str]:
    """`hyprun ARGS` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            hyprun(list(args))
    except SystemExit as exit_:
        code = exit_.code
    else:
        code = 0
    assert code in EXIT_CODES, (args, code, err.getvalue())
    assert "Traceback" not in err.getvalue(), err.getvalue()
    return code, out.getvalue(), err.getvalue()


def snapshot(uri: str) -> dict:
    """Everything a command could have written: every run's status, params, tags, metrics."""
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], max_results=5000
    )
    return {
        r.info.run_id: (r.info.status, r.data.params, r.data.tags, r.data.metrics) for r in runs
    }


def refused_without_trace(uri: str, *args: str) -> str:
    """Run a command that must be refused: exit 2 (3 when escalated), one line, nothing
    written. Returns the line."""
    before = snapshot(uri)
    code, _, err = cli(*args)
    assert code in (2, 3), (args, code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hyprun: "), (args, err)
    assert "Traceback" not in err
    assert snapshot(uri) == before, f"{args} wrote to the store"
    return lines[0]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a store with one recorded baseline, investigation `inv` (2 seeds);
    each user copies it (the checkpoints are relative to the working folder)."""
    folder = tmp_path_factory.mktemp("recorded")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        store = Store(f"sqlite:///{folder}/mlflow.db", "hyprun")
        record_baseline(store, "inv", BUDGET, seeds=2, why="flat")
    return folder


@contextlib.contextmanager
def copy_of(recorded: Path, folder: Path):
    """Work in a copy of the recorded store in `folder`, as the tracking URI and the working
    folder (the artifact root stays the original's: read, never overwritten)."""
    shutil.copytree(recorded, folder, dirs_exist_ok=True)
    uri = f"sqlite:///{folder}/mlflow.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        yield uri


# ----------------------------------------------------------------- what must be refused


NOT_POSITIVE = st.sampled_from(["0", "-1", "-1e-3", "nan", "inf", "-inf", "1e400", "-1e400"])
NOT_A_NUMBER = st.sampled_from(["abc", "'1e-3'", "true", "null", "[1,2]", "{a:1}", "0x10", "''"])
HOSTILE_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12
)
SHELL = st.sampled_from(["$(id)", "`id`", "; rm -rf /", "| cat", "&& true", "> /tmp/x", "*", "\n"])


def asks_help(text: str) -> bool:
    """`-h`, `--help` or an abbreviation argparse expands to it: help is printed, exit 0."""
    return text == "-h" or (len(text) > 2 and "--help".startswith(text))


def bad_value(key: str) -> st.SearchStrategy[str]:
    return st.one_of(NOT_POSITIVE, NOT_A_NUMBER).map(lambda v: f"{key}={v}")


def quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


REFUSED = st.one_of(
    # values the job refuses: LR, sizes, schedule, optimizer
    bad_value("optim.lr").map(lambda o: [o]),
    st.sampled_from(["0", "-2", "2.5", "abc", str(10**15), str(2**70)]).map(
        lambda v: [f"model.n_layer={v}"]
    ),
    st.sampled_from(["3", "0", "-4", "7"]).map(lambda v: [f"model.n_head={v}"]),
    st.sampled_from(["-0.1", "1", "2", "nan"]).map(lambda v: [f"sched.warmup_frac={v}"]),
    st.sampled_from(["[2,3]", "[0.9]", "[-1,0.9]", "abc"]).map(lambda v: [f"optim.betas={v}"]),
    st.sampled_from(["-1", "abc", "nan"]).map(lambda v: [f"optim.weight_decay={v}"]),
    # hostile text, as values of text keys, as keys, and raw
    HOSTILE_TEXT.filter(lambda t: t not in ("rmsnorm", "layernorm")).map(
        lambda t: [f"model.norm={quoted(t)}"]
    ),
    HOSTILE_TEXT.map(lambda t: [f"optim.lr={quoted(t)}"]),
    SHELL.map(lambda t: [f"optim.lr={t}"]),
    SHELL.map(lambda t: [f"model.norm={t}"]),
    HOSTILE_TEXT.filter(lambda t: "=" not in t and t not in CARD_IDS and not asks_help(t)).map(
        lambda t: [t]
    ),
    HOSTILE_TEXT.map(lambda t: [f"{t}=1"]),
    # malformed: empty keys, deletions, packages, sweeps, unknown or added keys
    st.sampled_from(["=0.1", "=", "@x=1", "~optim.lr", "optim.lr", "optim.lr=1,2", "+foo=1"]).map(
        lambda o: [o]
    ),
    st.from_regex(r"[a-z]{3,8}", fullmatch=True).map(lambda k: [f"optim.{k}x=1"]),
    # the one-variable rule: repeats, two variables, switches, controlled variables, no-ops
    st.sampled_from(["1e-4", "3e-3"]).map(lambda v: [f"optim.lr={v}", f"optim.lr={v}"]),
    st.just(["optim.lr=3e-3", "model.n_layer=3"]),
    st.sampled_from(["optim=sgd", "sched=wsd", "sched=constant", "model=gpt_small"]).map(
        lambda o: [o]
    ),
    st.sampled_from(["budget.seed=7", "budget.tokens=8192", "probes.every_steps=1"]).map(
        lambda o: [o]
    ),
    st.just(["optim.lr=0.001"]),  # the baseline's own value
)


@pytest.mark.slow  # a baseline (2 tiny seeds), then ~40 refusals at 1-3 s each
@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hypothesis=REFUSED)
@example(hypothesis=["optim.lr=abc"])  # issue 12: claimed H1, left RUNNING, locked the rest
@example(hypothesis=["optim.lr=nan"])
@example(hypothesis=["optim.lr=-1"])
@example(hypothesis=["model.n_layer=0"])  # claimed, then KILLED `refused` with a number
@example(hypothesis=["optim.lr=1e-3", "optim.lr=2e-3"])  # a repeated key, last one won
@example(hypothesis=["=0.1"])  # a 40-line traceback, exit 1
@example(hypothesis=["optim=sgd"])  # moved optim.lr and weight decay, passed as one variable
@example(hypothesis=["~optim.lr"])  # ConfigKeyError traceback in validate
@example(hypothesis=["optim.lr='[/x]'"])  # rich markup in a printed value
@example(hypothesis=["-:"])  # argparse took it for an option: 4 lines of usage
def test_refused_input_changes_nothing(recorded, tmp_path_factory, hypothesis):
    folder = tmp_path_factory.getbasetemp() / "refusals"
    if not folder.exists():
        shutil.copytree(recorded, folder)
    uri = f"sqlite:///{folder}/mlflow.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        refused_without_trace(uri, "test", *hypothesis, "--why", WHY, "--investigation", "inv")


def test_a_switch_is_refused_with_its_pinned_form_which_passes():
    with pytest.raises(BadInput) as refused:
        measure([], ["optim=sgd"])
    message = str(refused.value)
    assert "also changes optim.lr, optim.weight_decay" in message
    pinned = message.split("'hyprun test ")[1].split("'")[0].split()
    assert pinned == ["optim=sgd", "optim.lr=0.001", "optim.weight_decay=0.1"]
    delta = measure([], pinned)
    assert delta.variable == "optim" and delta.compound == ()
    # keys only one choice has (momentum, nesterov, betas, eps) belong to the switch
    assert {"optim.momentum", "optim.betas"} <= set(delta.changes)
    compound = measure([], ["sched=cosine_warm_restarts"], compound=True)
    assert compound.compound == ("sched.min_lr_ratio", "sched.warmup_frac")
    assert compound.describe().startswith("compound sched")


@pytest.mark.slow  # a baseline, then three tests of 2 tiny seeds each
def test_diverging_before_the_first_evaluation_is_a_strike_and_three_escalate(recorded, tmp_path):
    with copy_of(recorded, tmp_path) as uri:
        store = Store(uri, "hyprun")
        for number, lr in enumerate(("1e30", "1e31", "1e32"), start=1):
            code, _, err = cli("test", f"optim.lr={lr}", "--why", WHY, "--investigation", "inv")
            assert code == 0, err
            state = store.find("inv")
            test = state.tests[-1]
            assert test.verdict == "rejected", test.tags  # before: error, "no finite value"
            assert test.tags["hyprun.reason"].startswith("diverged"), test.tags
            assert state.strikes == number
        assert state.escalated and "Escalated" in err
        for test in state.tests:
            metrics = store.run(test.run_id).data.metrics
            assert math.isnan(metrics["effect/eval_loss"]) and math.isnan(
                metrics["noise/eval_loss"]
            )
        code, _, err = cli("report", "--investigation", "inv")
        assert code == 0, err


# -------------------------------------------------------------------------- the state machine


def strikes_from_tags(uri: str, investigation: str) -> int:
    """Strikes as the raw tags say, counted apart from runner/store: tests tagged
    hyprun.strike=true, since the last reset, numbered after the last confirmed test."""
    client = MlflowClient(tracking_uri=uri)
    [parent] = client.search_runs(
        [client.get_experiment_by_name("hyprun").experiment_id],
        filter_string=f"tags.`hyprun.investigation` = '{investigation}' "
        "and tags.`hyprun.role` = 'investigation'",
    )
    resets = [json.loads(v)["time"] for k, v in parent.data.tags.items() if "hyprun.reset." in k]
    numbers = {
        run: int(key[len("test.H") :])
        for key, run in parent.data.params.items()
        if key.startswith("test.H")
    }
    tests = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' "
        "and tags.`hyprun.role` = 'test'",
    )
    since = max(resets, default=0)
    tests = [
        t
        for t in tests
        if int(t.data.tags["hyprun.claimed_ms"]) >= since and t.info.run_id in numbers
    ]
    last = max(
        (numbers[t.info.run_id] for t in tests if t.data.tags["hyprun.verdict"] == "confirmed"),
        default=0,
    )
    return sum(
        t.data.tags.get("hyprun.strike") == "true" for t in tests if numbers[t.info.run_id] > last
    )


VALID = st.one_of(
    st.sampled_from(["3e-3", "1e-2", "3e-4", "1e30", "1e31", "2e-3", "5e-4"]).map(
        lambda v: [f"optim.lr={v}"]
    ),
    st.sampled_from(["0.01", "0.04"]).map(lambda v: [f"model.init_std={v}"]),
    st.just(["sched=wsd", "sched.min_lr_ratio=0.1"]),  # pinned: one variable
    st.just(["sched_cosine_warm_restarts"]),  # a card that declares its switch compound
    st.just(["lr_up_10x"]),
)


def recorded_delta(hypothesis: list[str]) -> tuple[str, ...]:
    """The delta as the controller records it, measured as the controller measures it (a card
    that declares its switch compound is measured so)."""
    card, overrides = choose(hypothesis, load_cards())
    return measure(BUDGET, overrides, compound=bool(card and card.compound)).overrides


class Investigation(RuleBasedStateMachine):
    """One investigation driven through the CLI; every invariant checked after every step."""

    recorded: Path
    """The folder of the recorded baseline (set by the test that runs the machine)."""

    def __init__(self) -> None:
        super().__init__()
        self.uri = ""
        self.tested: set[tuple[str, ...]] = set()

    @initialize()
    def start(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="example", dir=self.recorded.parent))
        shutil.copytree(self.recorded, self.folder, dirs_exist_ok=True)
        self.uri = f"sqlite:///{self.folder}/mlflow.db"
        self.cwd = os.getcwd()
        os.chdir(self.folder)
        os.environ["MLFLOW_TRACKING_URI"] = self.uri

    def teardown(self) -> None:
        if self.uri:
            os.chdir(self.cwd)
            os.environ.pop("MLFLOW_TRACKING_URI", None)

    def status(self) -> dict:
        code, out, err = cli("status", "--investigation", "inv", "--json")
        assert code == 0, err
        return json.loads(out)

    def is_new(self, hypothesis: list[str]) -> bool:
        """Whether the controller would take it as a new test: its delta as the controller
        records it (a card's, relative values made absolute) was not tested before."""
        return recorded_delta(hypothesis) not in self.tested

    def remember(self, hypothesis: list[str]) -> None:
        self.tested.add(recorded_delta(hypothesis))

    @rule(hypothesis=REFUSED)
    def refused(self, hypothesis: list[str]) -> None:
        refused_without_trace(self.uri, "test", *hypothesis, "--why", WHY, "--investigation", "inv")

    @rule(hypothesis=VALID)
    def valid(self, hypothesis: list[str]) -> None:
        escalated = self.status()["escalated"]
        before = snapshot(self.uri)
        code, _, err = cli("test", *hypothesis, "--why", WHY, "--investigation", "inv")
        assert "Traceback" not in err
        if escalated:
            assert code == 3 and snapshot(self.uri) == before, err
        elif not self.is_new(hypothesis):
            assert code == 2 and "tested already" in err and snapshot(self.uri) == before, err
        else:  # never refused because of anything earlier
            assert code in (0, 1), err
            self.remember(hypothesis)

    @rule(hypothesis=VALID, moment=st.floats(0.0, 1.0))
    def killed(self, hypothesis: list[str], moment: float) -> None:
        """kill -9 of a controller at a random moment of its life, then the same command again:
        it resumes the test, runs it afresh (killed before its claim) or says it was tested."""
        if self.status()["escalated"] or not self.is_new(hypothesis):
            return
        command = [sys.executable, "-m", "hyprun.runner.cli.main", "test", *hypothesis]
        command += ["--why", WHY, "--investigation", "inv"]
        process = subprocess.Popen(
            command,
            cwd=self.folder,
            env=python_env(MLFLOW_TRACKING_URI=self.uri),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(2.0 + 28.0 * moment)  # imports take seconds: claims happen ~5-15 s in
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        code, _, err = cli("test", *hypothesis, "--why", WHY, "--investigation", "inv")
        assert code in (0, 1) or (code == 2 and "tested already" in err), err
        self.remember(hypothesis)

    @precondition(lambda self: self.uri and self.status()["escalated"])
    @rule()
    def reset(self) -> None:
        """A human's decision after an escalation: the investigation reopens."""
        code, _, err = cli("reset", "--investigation", "inv", "--by", "ana", "--reason", "go on")
        assert code == 0, err
        assert not self.status()["escalated"]

    @precondition(lambda self: self.tested)
    @rule()
    def report(self) -> None:
        code, _, err = cli("report", "--investigation", "inv", "--out", str(self.folder / "report"))
        assert code == 0, err

    @invariant()
    def holds(self) -> None:
        if not self.uri:
            return
        document = self.status()
        strikes = strikes_from_tags(self.uri, "inv")
        assert document["strikes"] == strikes, (document, strikes)
        assert document["escalated"] == (strikes >= STRIKES)
        for run_id, (status, _, tags, metrics) in snapshot(self.uri).items():
            assert status != "RUNNING", (run_id, tags)  # every controller has returned
            if tags.get("hyprun.role") == "test" and tags.get("hyprun.verdict") in (
                "confirmed",
                "rejected",
                "inconclusive",
            ):
                named = {name.split("/")[0] for name in metrics}
                assert {"effect", "noise"} <= named, (tags, metrics)


@pytest.mark.slow  # real tests of a tiny GPT, a subprocess killed and resumed: ~5 min on 2 cores
def test_the_investigation_holds_its_invariants(recorded):
    Investigation.recorded = recorded
    run_state_machine_as_test(
        Investigation,
        settings=settings(
            max_examples=4,
            stateful_step_count=8,
            suppress_health_check=list(HealthCheck),
        ),
    )
