"""Investigations are found wherever they are in the MLflow store, and a miss says where they are.

No training: the parent runs are made with `Store.create`, as `hyprun baseline` makes them."""

from __future__ import annotations

import json

import pytest

from runner.cli.main import main as hyprun
from runner.errors import BadInput
from runner.store.investigation import Store


@pytest.fixture
def uri(workdir) -> str:
    return f"sqlite:///{workdir}/mlflow.db"


def run_cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_:
        hyprun(list(args))
    return exit_.value.code


def test_an_investigation_in_another_experiment_is_found_and_followed(uri):
    Store(uri, "hyprun-demo").create("demo-1", "the demo's")
    store = Store(uri, "hyprun")  # the config's experiment, empty
    state = store.find(None)
    assert state.name == "demo-1" and store.experiment == "hyprun-demo"  # tests land beside it
    assert Store(uri, "hyprun").find("demo-1").run_id == state.run_id
    with pytest.raises(BadInput, match="exists already"):  # names are unique in the store
        Store(uri, "hyprun").create("demo-1", "again")


def test_the_configs_experiment_comes_first(uri):
    Store(uri, "hyprun").create("mine", "older, in my experiment")
    Store(uri, "hyprun-demo").create("demo-1", "newer, elsewhere")
    assert Store(uri, "hyprun").find(None).name == "mine"
    assert Store(uri, "elsewhere").find(None).name == "demo-1"  # newest of the rest


def test_a_pinned_experiment_names_the_experiments_that_have_investigations(uri):
    Store(uri, "hyprun-demo").create("demo-1", "the demo's")
    Store(uri, "hyprun-demo").create("demo-2", "the demo's")
    with pytest.raises(BadInput) as missed:
        Store(uri, "hyprun", pinned=True).find(None)
    assert "in experiment 'hyprun'" in str(missed.value)
    assert "experiment 'hyprun-demo' (2)" in str(missed.value)
    with pytest.raises(BadInput, match="in this MLflow store .*start one with 'hyprun baseline'"):
        Store(f"{uri}-empty", "hyprun").find(None)


def test_cli_status_finds_the_demos_investigation(uri, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    Store(uri, "hyprun-demo").create("demo-1", "the demo's")
    assert run_cli("status", "--json") == 0
    assert json.loads(capsys.readouterr().out)["investigation"] == "demo-1"
    assert run_cli("status", "--experiment", "hyprun") == 2  # pinned: not there, and says where
    assert "experiment 'hyprun-demo' (1): pass --experiment NAME" in capsys.readouterr().err
