"""Tests of one investigation racing each other against one real `mlflow server`: claims made at
the same moment, verdicts written at the same moment, and two `hyprun test` commands started
together with one strike left. The strike count and the state must come out exact."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.faults import RACERS, notice_count, notifying_baseline, race
from hyprun.runner.control import controller
from hyprun.runner.control.controller import EXIT_ESCALATED
from hyprun.runner.store.investigation import STRIKES, Store
from tests.helpers import python_env

pytestmark = pytest.mark.slow  # several controllers racing, each running seed jobs: minutes

WHY = "I think [cause] because [evidence]"


def test_six_tests_at_once_take_exact_numbers_strikes_and_one_escalation(mlflow_server, workdir):
    """Six claims at the same moment: each gets its own number, exactly the three lowest may run
    (three strikes are left), the other three are refused. The three then record rejections at
    the same moment: three strikes, escalated, one escalation report, one notice, and the next
    test is refused as escalated."""
    store = Store(mlflow_server, "hyprun")
    notices = workdir / "notices.jsonl"
    outcomes = race(store, "race", notices, workdir / "ckpt")
    assert outcomes == [
        ("claimed", 1),
        ("claimed", 2),
        ("claimed", 3),
        ("refused", 2),
        ("refused", 2),
        ("refused", 2),
    ]

    state = store.find("race")
    assert sorted(t.number for t in state.tests) == list(range(1, RACERS + 1))
    assert [t.verdict for t in state.tests] == ["rejected"] * STRIKES + ["refused"] * 3
    assert state.strikes == STRIKES and state.escalated
    for test in state.tests:
        status = store.client.get_run(test.run_id).info.status
        assert status == ("FINISHED" if test.verdict == "rejected" else "KILLED")
    parent = store.client.get_run(state.run_id)
    assert parent.data.tags["hyprun.escalated"] == "true"
    assert [k for k in parent.data.params if k.startswith("escalation.")] == ["escalation.1"]
    assert "escalation.md" in {a.path for a in store.client.list_artifacts(state.run_id)}
    assert notice_count(notices) == 1

    late = controller.test(store, "race", ["optim.lr=3e-5"], WHY)
    assert late.exit_code == EXIT_ESCALATED
    assert len(store.find("race").tests) == RACERS  # a refusal while escalated claims nothing


def test_two_commands_started_together_cannot_both_take_the_last_strike(mlflow_server, workdir):
    """Two strikes down, two `hyprun test` commands at once: one runs (and is rejected: the
    third strike, one notice), the other is refused with the reason and takes no job."""
    store = Store(mlflow_server, "hyprun")
    notices = workdir / "notices.jsonl"
    state = notifying_baseline(store, "last-strike", notices, workdir / "ckpt")
    for factor in ("*0.1", "*0.01"):  # hypotheses that cannot help a too-low LR
        # one look (the fixed rule at the baseline's 2 seeds): strikes are the subject here
        outcome = controller.test(store, "last-strike", [f"optim.lr={factor}"], WHY, max_seeds=2)
        assert outcome.verdict["status"] == "rejected"
    command = [
        sys.executable,
        "-m",
        "hyprun.runner.cli.main",
        "test",
        "--why",
        WHY,
        "--investigation",
        "last-strike",
        "--max-seeds",
        "2",
    ]
    env = python_env(MLFLOW_TRACKING_URI=mlflow_server)
    commands = [
        subprocess.Popen(
            [*command, f"optim.lr={value}"],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for value in (2e-7, 3e-7)
    ]
    outputs = [c.communicate(timeout=600)[0] for c in commands]
    codes = sorted(c.returncode for c in commands)
    assert codes == [0, 2], outputs
    refused = outputs[[c.returncode for c in commands].index(2)]
    assert "tests ahead could still take the last strikes" in refused

    state = store.refresh(state)
    assert [t.verdict for t in state.tests] == ["rejected"] * 3 + ["refused"]
    assert state.strikes == STRIKES and state.escalated
    refused_run = state.tests[-1].run_id
    assert store.seed_runs(refused_run) == []  # no job ran for the refused command
    assert notice_count(notices) == 1


@pytest.fixture(autouse=True)
def _server_uri(monkeypatch, mlflow_server):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
