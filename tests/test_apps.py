"""A user's Hydra app as the job (runner/launch/app.py), on the toy app in tests/apps/toy: its
hyprun.yaml refused in one line when a declaration is missing, the one-variable rule on its own
tree, in-process and subprocess runs into the MLflow run hyprun hands it, and an app that logs
nothing comparable as an error. Real Hydra, MLflow and sqlite; the app is plain Python."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from hyprun.runner.cli.main import main as hyprun
from hyprun.runner.store.investigation import Store

ROOT = Path(__file__).parents[1]
TOY = ROOT / "tests" / "apps" / "toy"
APP = "tests.apps.toy.train:main"
WHY = "I think [cause] because [evidence]"


def run_cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_:
        hyprun(list(args))
    return exit_.value.code


@pytest.fixture
def here(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder whose MLflow store is a sqlite file in it."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/mlflow.db")
    # The toy app is importable as a user's installed package would be, from any folder.
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    )
    return workdir


def declare(folder: Path, **changes) -> None:
    """hyprun.yaml in `folder`: the toy app's own, with entries changed (None deletes one;
    dotted names reach inside)."""
    declared = yaml.safe_load((TOY / "hyprun.yaml").read_text())
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = declared
        for part in path:
            node = node[part]
        if value is None:
            node.pop(last)
        else:
            node[last] = value
    (folder / "hyprun.yaml").write_text(yaml.safe_dump(declared))


def runs_in(folder: Path) -> int:
    """How many runs the folder's MLflow store holds (none when it was never created)."""
    if not (folder / "mlflow.db").exists():
        return 0
    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    experiments = [e.experiment_id for e in client.search_experiments()]
    return len(client.search_runs(experiments)) if experiments else 0


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"controlled__heldout": None}, "controlled.heldout is missing: add controlled.heldout"),
        ({"controlled__seed": None}, "controlled.seed is missing"),
        ({"controlled": None}, "controlled is missing: declare controlled:"),
        ({"metric__step": None}, "metric.step is missing: add metric.step: tokens or steps"),
        ({"metric": None}, "metric is missing"),
        ({"metric__direction": "down"}, "metric.direction: Input should be 'min' or 'max'"),
        ({"controled": {"seed": "seed"}}, "controled: Extra inputs are not permitted"),
        ({"controlled__budget": "max_step"}, "controlled.budget names 'max_step', which is not"),
        ({"controlled__seed": "data"}, "controlled.seed names 'data', which is {"),
        ({"app": "tests.apps.toy.train:nope"}, "defines no function 'nope'"),
        ({"app": "tests.apps.nope:main"}, "no Python module 'tests.apps.nope'"),
    ],
)
def test_a_missing_or_wrong_declaration_is_one_line_exit_2_and_nothing_written(
    here, capsys, changes, message
):
    declare(here, **changes)
    assert run_cli("baseline", "--seeds", "1") == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert runs_in(here) == 0
    assert not (here / ".hyprun").exists()


def test_an_app_without_hyprun_yaml_is_refused(here, capsys):
    package = here / "myapp"
    shutil.copytree(TOY, package, ignore=shutil.ignore_patterns("hyprun.yaml", "__pycache__"))
    try:
        assert run_cli("baseline", "--app", "myapp.train:main") == 2
    finally:
        sys.modules.pop("myapp", None)
    err = capsys.readouterr().err
    assert "no hyprun.yaml in" in err and "declaring controlled:" in err, err
    assert runs_in(here) == 0


def test_toy_app_baseline_test_and_the_one_variable_rule_on_its_tree(here, capsys):
    assert run_cli("baseline", "--app", APP, "--seeds", "2", "--investigation", "toy") == 0
    store = Store(f"sqlite:///{here}/mlflow.db", "hyprun")
    state = store.find("toy")
    assert state.baseline["app"]["target"] == APP
    seed_runs = [store.run(r) for r in state.baseline["seed_runs"]]
    for seed, run in enumerate(seed_runs):  # the app logged into the run hyprun made for it
        tags = run.data.tags
        assert tags["hyprun.seed"] == str(seed) and tags["hyprun.outcome"] == "completed"
        assert tags["hyprun.steps"] == "40" and run.info.status == "FINISHED"
        assert [s for s, _ in store.history(run.info.run_id, "val/loss")] == [10, 20, 30, 40]
        assert run.data.params["config.seed"] == str(seed)
        assert (here / ".hyprun" / "apps" / f"{state.run_id}-seed{seed}").is_dir()
    capsys.readouterr()

    refusals = {
        ("opt.lr=0.2", "opt.momentum=0.5"): "changes 2 variables (opt.lr, opt.momentum)",
        ("max_steps=80",): "max_steps is a controlled variable (the budget is fixed",
        ("data.seed=3",): "data.seed is a controlled variable",
        ("data.heldout=10",): "data.heldout is a controlled variable",
        ("opt.lr=0.002",): "changes nothing",
        ("output_dir=/elsewhere",): "changes nothing",  # declared bookkeeping (ignored:)
        ("opt.lrr=1",): "unknown config key 'opt.lrr'",
    }
    for hypothesis, message in refusals.items():
        assert run_cli("test", *hypothesis, "--why", WHY) == 2, hypothesis
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert store.find("toy").tests == []

    # A group switch of the app's own tree that moves a key both choices share is refused with
    # its pinned form, as on ours (opt=fast is opt.lr 0.002 -> 0.2 under another name).
    assert run_cli("test", "opt=fast", "--why", WHY) == 2
    err = capsys.readouterr().err
    assert "opt switch also changes opt.lr" in err and "'hyprun test opt=fast opt.lr=0.002'" in err
    assert run_cli("test", "opt.lr=0.2", "--why", WHY) == 0
    test = store.find("toy").tests[0]
    assert test.variable == "opt.lr" and test.verdict == "confirmed", test.tags["hyprun.reason"]
    assert "val/loss" in test.tags["hyprun.reason"]


@pytest.mark.slow  # the toy app in subprocesses
def test_subprocess_run_matches_in_process(here):
    declare(here, run="subprocess")
    assert run_cli("baseline", "--seeds", "1", "--investigation", "apart") == 0
    declare(here)
    assert run_cli("baseline", "--seeds", "1", "--investigation", "inside") == 0
    store = Store(f"sqlite:///{here}/mlflow.db", "hyprun")
    apart, inside = (store.find(name).baseline["seed_runs"][0] for name in ("apart", "inside"))
    assert store.history(apart, "val/loss") == store.history(inside, "val/loss")
    assert len(store.history(apart, "val/loss")) == 4


def test_an_app_that_logs_no_comparable_metric_is_an_error_naming_it(here, capsys):
    declare(here, metric__name="val/accuracy")
    assert run_cli("baseline", "--seeds", "2", "--investigation", "mute") == 1
    err = capsys.readouterr().err
    assert "logged no 'val/accuracy'" in err and "it logged: val/loss" in err, err
    assert "metric.name" in err


def test_a_test_whose_app_crashes_or_logs_nothing_is_an_error_not_a_strike(here, capsys):
    assert run_cli("baseline", "--app", APP, "--seeds", "2", "--investigation", "err") == 0
    assert run_cli("test", "crash=true", "--why", WHY) == 1
    assert "RuntimeError: out of memory in block 3" in capsys.readouterr().err
    assert run_cli("test", "metric_name=loss", "--why", WHY) == 1
    assert "logged no 'val/loss'" in capsys.readouterr().err
    state = Store(f"sqlite:///{here}/mlflow.db", "hyprun").find("err")
    assert [t.verdict for t in state.tests] == ["error", "error"] and state.strikes == 0


def test_a_sweep_searches_one_key_of_the_apps_tree(here):
    assert run_cli("baseline", "--app", APP, "--seeds", "2", "--investigation", "sweep") == 0
    sweep = "opt.lr=tag(log, interval(0.001, 0.5))"
    assert run_cli("sweep", sweep, "--trials", "3", "--why", WHY) == 0
    state = Store(f"sqlite:///{here}/mlflow.db", "hyprun").find("sweep")
    [test] = state.tests
    assert test.variable == "opt.lr" and test.verdict == "confirmed", test.tags["hyprun.reason"]
    assert "val/loss" in test.tags["hyprun.reason"] and "best opt.lr=" in test.tags["hyprun.reason"]
    assert run_cli("sweep", "max_steps=range(10, 40)", "--trials", "2", "--why", WHY) == 2


def test_an_app_counted_in_steps_is_reported_in_steps_and_its_run_says_where_it_stands(
    here, capsys
):
    """The toy app's metric step counts steps: no number is labelled tokens (report, status,
    tags), and its investigation's run, fixed by H1 and then escalated, says escalated."""
    assert run_cli("baseline", "--app", APP, "--seeds", "2", "--investigation", "steps") == 0
    capsys.readouterr()
    assert run_cli("test", "opt.lr=0.2", "--max-tokens", "50", "--why", WHY) == 2
    assert "one round of 2 seeds x 40 steps: give at least 80" in capsys.readouterr().err
    assert run_cli("test", "opt.lr=0.2", "--why", WHY) == 0  # confirmed: faster
    for slower in ("opt.lr=0.001", "opt.lr=0.0005", "opt.lr=0.0002"):
        assert run_cli("test", slower, "--why", WHY) == 0
    store = Store(f"sqlite:///{here}/mlflow.db", "hyprun")
    state = store.find("steps")
    assert [t.verdict for t in state.tests] == ["confirmed", "rejected", "rejected", "rejected"]
    assert state.escalated
    name = store.run(state.run_id).info.run_name
    assert name == "steps · escalated after 3 rejections since H1's fix", name
    assert run_cli("reset", "--investigation", "steps", "--by", "me", "--reason", "why") == 0
    name = store.run(state.run_id).info.run_name  # a human reset: the name follows it too
    assert name.startswith("steps · fixed by H1 opt.lr=0.2 (val/loss \u221273%"), name

    seed = store.run(state.baseline["seed_runs"][0]).data.tags
    assert seed["hyprun.steps"] == "40" and "hyprun.tokens" not in seed  # no 0 tokens
    capsys.readouterr()
    assert run_cli("status", "--investigation", "steps", "--json") == 0
    rows = json.loads(capsys.readouterr().out)["tests"]
    assert [r["spent"] for r in rows] == ["80 steps"] * 4, rows

    assert run_cli("report", "--investigation", "steps") == 0
    md = (here / ".hyprun" / "reports" / "steps" / "report.md").read_text()
    assert "- **Steps on tests**: 320 spent" in md
    assert "| steps spent | steps saved |" in md and "tokens" not in md.lower(), md
    assert "| val/loss 3.771 → 1.003 at 40 steps | 80 | 0 (0%) | 2 |" in md
    plots = [line for line in md.splitlines() if line.startswith("![")]
    assert len(plots) == len(set(plots)), plots
