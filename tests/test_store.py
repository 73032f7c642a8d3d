"""Investigations are found wherever they are in the MLflow store, and a miss says where they are.

No training: the parent runs are made with `Store.create`, as `hyprun baseline` makes them."""

from __future__ import annotations

import json

import pytest

from hyprun.runner.cli.main import main as hyprun
from hyprun.runner.errors import BadInput
from hyprun.runner.store.investigation import Store, view_keys
from tests.helpers import after_importing_runner


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


FINDINGS = [
    {
        "id": "noisy_labels",
        "cause": "noisy training labels",
        "first_action": "audit a sample of training targets",
        "cards": [],
        "variables": [],
    },
    {
        "id": "loss_plateau",
        "cause": "LR too high",
        "first_action": "reduce the LR",
        "cards": ["lr_down_10x"],
        "variables": ["optim.lr"],
    },
]


def _investigation(store: Store) -> str:
    """A parent as `hyprun baseline` leaves it: triage's findings tagged, finished."""
    parent = store.create("inv", "note")
    store.tag(parent, {"hyprun.findings": json.dumps(FINDINGS)})
    store.finish(parent)
    return parent


def _test(store: Store, parent: str, number: int, variable: str, card: str = "") -> str:
    run = store.child(
        parent,
        f"H{number}",
        {
            "hyprun.role": "test",
            "hyprun.investigation": "inv",
            "hyprun.delta": json.dumps([f"{variable}=1"]),
            "hyprun.variable": variable,
            "hyprun.card": card,
            "hyprun.verdict": "running",
        },
    )
    assert store.once(parent, f"test.H{number}", run)
    return run


def test_findings_no_test_touched_are_named_until_a_test_touches_them(uri):
    from hyprun.runner.control.escalation import escalation_findings
    from hyprun.runner.control.standing import summary
    from hyprun.runner.store.investigation import findings_lines

    store = Store(uri, "hyprun")
    parent = _investigation(store)
    state = store.find("inv")
    assert [f["id"] for f in state.findings] == ["noisy_labels", "loss_plateau"]
    assert not any(line.startswith("not tested yet") for line in findings_lines(state))

    _test(store, parent, 1, "optim.lr", card="lr_down_10x")  # touches loss_plateau only
    state = store.refresh(state)
    assert [f["id"] for f in state.untested] == ["noisy_labels"]
    assert findings_lines(state)[-1] == (
        "not tested yet: noisy_labels — first action: audit a sample of training targets"
    )
    assert "- not tested yet: noisy_labels" in summary(state)
    text = "\n".join(escalation_findings(state))
    assert "The evidence pointed at noisy_labels, and no test has touched it yet" in text
    assert "1. **noisy_labels** (**not tested yet**; no card)" in text
    assert "2. **loss_plateau** (tested; lr_down_10x)" in text

    _test(store, parent, 2, "data.source.label_noise")  # no card: its variable does not count
    assert [f["id"] for f in store.refresh(state).untested] == ["noisy_labels"]


def test_the_parent_run_follows_its_tests_not_its_baseline(uri):
    from hyprun.runner.control.standing import settle

    store = Store(uri, "hyprun")
    parent = _investigation(store)
    baseline_end = store.run(parent).info.end_time
    test = _test(store, parent, 1, "optim.lr")
    store.reopen(parent)  # what claim() does once the test may run
    assert store.run(parent).info.status == "RUNNING"
    state = settle(store, store.find("inv"))  # a test still running: the parent runs on
    assert store.run(parent).info.status == "RUNNING"
    assert store.run(parent).info.run_name == "inv · 0 tested, 0/3 strikes, 1 running"

    store.tag(test, {"hyprun.verdict": "rejected", "hyprun.effect": "eval/loss +4% ± 1%"})
    store.finish(test)
    settle(store, state)
    run = store.run(parent)
    assert run.info.status == "FINISHED" and run.info.end_time >= store.run(test).info.end_time
    assert run.info.end_time > baseline_end
    assert run.info.run_name == "inv · 1 tested, 1/3 strikes"
    assert (
        "- H1 `optim.lr=1`: rejected · eval/loss +4% ± 1%" in run.data.tags["mlflow.note.content"]
    )


def test_links_open_the_runs_not_the_genai_overview(uri):
    from hyprun.runner.store.investigation import links, save_views

    store = Store(uri, "hyprun")
    parent = _investigation(store)
    state = store.find("inv")
    found = links(store, state)
    experiment = store.run(parent).info.experiment_id
    assert found.serve == f"mlflow ui --backend-store-uri {uri}"
    for link, view, mode in ((found.runs, "runs", "TABLE"), (found.compare, "compare", "CHART")):
        assert link.startswith(f"http://127.0.0.1:5000/#/experiments/{experiment}/runs?")
        assert "workflowType=machine_learning" in link  # not the GenAI overview
        assert f"viewStateShareKey=hyprun-inv-{view}&compareRunsMode={mode}" in link

    save_views(store, state)
    tags = store.client.get_experiment(experiment).tags
    runs = json.loads(tags["mlflow.sharedViewState.hyprun-inv-runs"])
    compare = json.loads(tags["mlflow.sharedViewState.hyprun-inv-compare"])
    for envelope in (runs, compare):  # what MLflow's UI reads: name, createdAt, state (JSON)
        assert isinstance(envelope["name"], str) and isinstance(envelope["createdAt"], int)
    runs, compare = json.loads(runs["state"]), json.loads(compare["state"])
    assert runs["searchFilter"] == "tags.`hyprun.investigation` = 'inv'"
    assert runs["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "hyprun.role"}]
    assert compare["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "hyprun.arm"}]
    charts = [c["metricKey"] for c in compare["compareRunCharts"]]
    assert charts == ["eval/loss", "train/loss", "grad/norm"]


def test_view_keys_fit_mlflows_tag_key_and_keep_names_apart():
    hostile = "x$(touch p); `q` 'q'\n" * 20
    assert all(len("mlflow.sharedViewState." + key) <= 250 for key in view_keys(hostile))
    assert view_keys("a b") != view_keys("a-b")
    assert view_keys("inv") == ("hyprun-inv-runs", "hyprun-inv-compare")


@pytest.mark.parametrize(("given", "kept"), [(None, "true"), ("false", "false")])
def test_mlflow_telemetry_is_off_unless_the_user_turns_it_on(given, kept):
    """MLflow's telemetry thread raced our jobs (a KeyError on its session variable); importing
    hyprun turns it off unless the environment already says otherwise."""
    assert after_importing_runner("MLFLOW_DISABLE_TELEMETRY", given) == kept
