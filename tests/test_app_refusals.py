"""Refuse before writing, for a user's app (issue 26 item 4): a test of an app whose overrides it
could not take is refused in one line, exit 2, before it takes a number: no MLflow run, no tag,
no run folder, and the next valid test is still H1. And an app whose code changed after its
baseline (no git here) is refused as drift, naming the file.

A copy of the toy app (tests/apps/toy) as a package of the test's own folder, with a knob, a
preflight function and its hyprun.yaml; real Hydra, MLflow (sqlite) and the hyprun CLI.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from hyprun.runner.cli.main import main as hyprun
from hyprun.runner.store.investigation import Store

TOY = Path(__file__).parent / "apps" / "toy"
WHY = "I think [cause] because [evidence]"
CHECK = '''
def check(cfg):
    """The app's own preflight: what only it knows, said before anything trains."""
    if cfg.opt.momentum >= 1:
        raise ValueError(f"opt.momentum {cfg.opt.momentum} >= 1 diverges: keep it below 1")
'''


def run_cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_:
        hyprun(list(args))
    return exit_.value.code


def make_app(folder: Path, name: str) -> None:
    """The toy app as package `name` in `folder`, its hyprun.yaml with a knob and a preflight."""
    shutil.copytree(TOY, folder / name, ignore=shutil.ignore_patterns("hyprun.yaml", "__py*"))
    (folder / name / "checks.py").write_text(CHECK)
    declared = yaml.safe_load((TOY / "hyprun.yaml").read_text())
    declared.update(
        app=f"{name}.train:main", knobs={"optim.lr": "opt.lr"}, preflight=f"{name}.checks:check"
    )
    (folder / "hyprun.yaml").write_text(yaml.safe_dump(declared))


def everything(folder: Path) -> tuple:
    """What a refusal must leave as it was: the runs, their tags and params, the run folders."""
    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, max_results=1000)
    recorded = sorted((r.info.run_id, sorted(r.data.tags.items()), r.data.params) for r in runs)
    return recorded, sorted(p.name for p in (folder / ".hyprun" / "apps").iterdir())


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    """A 2-seed baseline of the toy app's copy, recorded once for the module's tests."""
    folder = tmp_path_factory.mktemp("app-refusals")
    make_app(folder, "refused_app")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder}/mlflow.db")
        assert run_cli("baseline", "--seeds", "2", "--investigation", "inv") == 0
    yield folder
    sys.modules.pop("refused_app", None)


@pytest.fixture
def here(recorded: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(recorded)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{recorded}/mlflow.db")
    return recorded


REFUSED = {
    "a string for a number": (["opt.lr=abc"], "opt.lr=abc: the app's baseline has opt.lr: 0.002"),
    "a list for a number": (["opt.lr=[1,2]"], "a number: give a number"),
    "a bool for a number": (["opt.momentum=true"], "opt.momentum: 0.9, a number: give a number"),
    "a number for a bool": (["crash=1"], "crash: False, true or false: give true or false"),
    "a bad knob value": (["opt.lr=-1"], "opt.lr=-1: the learning rate (optim.lr) must be > 0"),
    "a zero knob value": (["opt.lr=0"], "the learning rate (optim.lr) must be > 0"),
    "a new key under a node": (["+opt.foo=1"], "+opt.foo=1: opt.foo is new: it is not in the"),
    "a new top-level key": (["+foo=1"], "foo is new: it is not in the app's config, so nothing"),
    "the app's own preflight": (
        ["opt.momentum=1.5"],
        "the app's preflight (refused_app.checks:check) refused the config: ValueError: "
        "opt.momentum 1.5 >= 1 diverges: keep it below 1",
    ),
    "a card on an unmapped knob": (
        ["grad_clip"],
        "needs the knob ds.grad_clip: declare knobs: {ds.grad_clip: <your key>} in hyprun.yaml",
    ),
}


@pytest.mark.parametrize(("hypothesis", "expected"), REFUSED.values(), ids=REFUSED.keys())
def test_a_test_the_app_could_not_take_is_refused_in_one_line_and_writes_nothing(
    here, capsys, hypothesis, expected
):
    before = everything(here)
    capsys.readouterr()
    assert run_cli("test", *hypothesis, "--why", WHY) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1 and err.startswith("hyprun: "), err
    assert everything(here) == before  # no run, no tag, no param, no run folder


def test_after_the_refusals_a_card_runs_in_the_apps_keys_as_h1(here, capsys):
    """Runs after the parametrized refusals (file order): none of them took a number."""
    assert run_cli("test", "lr_up_10x", "--why", WHY) == 0
    [test] = Store(f"sqlite:///{here}/mlflow.db", "hyprun").find("inv").tests
    assert test.number == 1 and test.card == "lr_up_10x", test.tags
    assert test.delta == ["opt.lr=0.02"] and test.variable == "opt.lr"  # 0.002 x 10
    assert test.verdict == "confirmed", test.tags.get("hyprun.reason")


def test_an_app_edited_outside_git_after_its_baseline_is_refused_as_drift(
    workdir, monkeypatch, capsys
):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/mlflow.db")
    make_app(workdir, "drifting_app")
    try:
        assert run_cli("baseline", "--seeds", "1", "--investigation", "drift") == 0
        train = workdir / "drifting_app" / "train.py"
        train.write_text(train.read_text().replace("3.0 * math.exp", "2.0 * math.exp"))
        before = everything(workdir)
        capsys.readouterr()
        assert run_cli("test", "opt.lr=0.02", "--why", WHY) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "the app's code changed since the baseline" in err, err
        assert "(train.py edited under" in err and "revert the change, or record a new" in err
        assert everything(workdir) == before
    finally:
        sys.modules.pop("drifting_app", None)
