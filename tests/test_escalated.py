"""After the third strike the commands keep the investigation: `test` refuses it with exit 3 and
says where the escalation report is and how to reset; `status` and `report` show it.

No training: the investigations and their rejected tests are runs made as the controller makes
them (`Store.create`, `Store.child` with a test's tags); the state is derived from those tags."""

from __future__ import annotations

import json

import pytest

from hyprun.runner.cli.main import main as hyprun
from hyprun.runner.cli.main import parser
from hyprun.runner.store.investigation import INVESTIGATION, ROLE, Store


def run_cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_:
        hyprun(list(args))
    return exit_.value.code


def escalated(store: Store, name: str) -> str:
    """An investigation with three rejected tests: its run id."""
    run_id = store.create(name, "three strikes")
    for number in (1, 2, 3):
        tags = {ROLE: "test", INVESTIGATION: name, "hyprun.number": str(number)}
        test = store.child(run_id, f"H{number}", {**tags, "hyprun.verdict": "rejected"})
        store.finish(test)
    return run_id


@pytest.fixture
def store(workdir, monkeypatch) -> Store:
    uri = f"sqlite:///{workdir}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return Store(uri, "hyprun")


def test_a_test_after_the_third_strike_names_the_escalation_and_the_reset(store, capsys):
    store.create("older-open", "an open investigation from before")
    run_id = escalated(store, "struck")
    assert run_cli("test", "lr_up_10x", "--why", "I think the LR is low because ...") == 3
    refusals = [line for line in capsys.readouterr().err.splitlines() if "hyprun:" in line]
    assert len(refusals) == 1, refusals  # a refusal is one line
    said = refusals[0]
    assert "investigation 'struck' is escalated" in said and "(H1, H2, H3)" in said
    assert f"escalation.md on MLflow run {run_id}" in said
    assert "hyprun reset --investigation struck --by NAME --reason TEXT" in said


def test_status_and_report_show_the_escalated_investigation_and_where_to_read(store, capsys):
    store.create("older-open", "an open investigation from before")
    run_id = escalated(store, "struck")
    assert run_cli("status", "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["investigation"] == "struck" and shown["escalated"]
    assert run_cli("status") == 0
    printed = capsys.readouterr().out
    assert f"/runs/{run_id}/artifacts/escalation.md" in printed
    assert "hyprun reset --investigation struck --experiment hyprun" in printed
    assert run_cli("report") == 0
    said = capsys.readouterr().err
    assert f"also on MLflow run {run_id}" in said and "ESCALATED" in said
    assert run_cli("test", "lr_up_10x", "--investigation", "older-open", "--why", "x") == 2
    assert "'older-open' has no baseline" in capsys.readouterr().err  # named: still reachable


def test_every_command_states_the_same_default_investigation():
    commands = parser()._subparsers._group_actions[0].choices
    helps = {
        name: action.help
        for name, command in commands.items()
        for action in command._actions
        if "--investigation" in action.option_strings
    }
    assert "new one's name" in helps.pop("baseline")  # it names a new investigation
    assert set(helps.values()) == {"name (default: the newest one, open or escalated)"}, helps
