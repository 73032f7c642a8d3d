"""hyprun on training code nobody here wrote: a Hugging Face `Trainer` app and a Lightning app
(tests/apps/), each a Hydra app with its own conf/ and hyprun.yaml, training from scratch on
synthetic tokens (no weights downloaded). The whole method on each: a baseline with the learning
rate planted 30x too low (2 seeds) -> diagnose its recorded run -> the LR fix confirmed -> three
rejected recipe tweaks -> escalation, and no fourth test.

Real transformers, lightning, torch, Hydra and MLflow (sqlite); the apps run in this process,
one seed after another, as `hyprun baseline --app` runs them on a laptop.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyprun.runner.cli.main import main as hyprun
from hyprun.runner.store.investigation import Store

WHY = "I think the LR is too low because the held-out loss barely moves"


def run_cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_:
        hyprun(list(args))
    return exit_.value.code


@pytest.fixture
def here(workdir: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread) -> Path:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/mlflow.db")
    return workdir


def investigate(app: str, planted: str, fix: str, tweaks: list[str], capsys) -> Store:
    """The method end to end on `app`; returns its store for app-specific checks."""
    assert run_cli("baseline", "--app", app, planted, "--seeds", "2", "--investigation", "inv") == 0
    store = Store(f"sqlite:///{Path.cwd()}/mlflow.db", "hyprun")
    state = store.find("inv")
    assert state.baseline["app"]["target"] == app and len(state.baseline["seed_runs"]) == 2

    capsys.readouterr()
    assert run_cli("diagnose", "--run", state.baseline["seed_runs"][0], "--json") == 0
    document = json.loads(capsys.readouterr().out)
    checks = {c["id"]: c["status"] for c in document["obvious"]}
    # The app's own evidence (hyprun's callback inside its trainer) was measured, not skipped.
    assert checks["lr_reasonable"] == "pass" and checks["loss_sane"] == "pass", checks

    assert run_cli("test", fix, "--why", WHY) == 0
    for tweak in tweaks:
        assert run_cli("test", tweak, "--why", "I think the plateau report's recipe helps") == 0
    state = store.find("inv")
    verdicts = [(t.delta, t.verdict, t.tags.get("hyprun.reason")) for t in state.tests]
    assert [v for _, v, _ in verdicts] == ["confirmed", "rejected", "rejected", "rejected"], (
        verdicts
    )
    assert state.escalated and state.strikes == 3
    assert run_cli("test", "--investigation", "inv", fix, "--why", WHY) == 3  # escalated
    return store


@pytest.mark.slow  # 10 seeds of two HF Trainer runs each (~2 min on 2 busy cores)
def test_hf_trainer_app_baseline_diagnose_confirm_and_escalate(here, capsys):
    store = investigate(
        "tests.apps.hf_gpt2.train:main",
        "training.learning_rate=1e-4",
        "training.learning_rate=3e-3",
        [
            "training.learning_rate=3e-5",
            "training.warmup_steps=30",
            "training.lr_scheduler_type=cosine",
        ],
        capsys,
    )
    test = store.find("inv").tests[0]
    for run in store.seed_runs(test.run_id):  # the Trainer's own MLflow logging, in our runs
        assert "eval_loss" in run.data.metrics and "train/loss" in run.data.metrics
        assert run.data.params["learning_rate"] == "0.003"


@pytest.mark.slow  # 10 seeds of two Lightning runs each (~2 min on 2 busy cores)
def test_lightning_app_baseline_diagnose_confirm_and_escalate(here, capsys):
    store = investigate(
        "tests.apps.lightning_gpt.train:main",
        "optim.lr=1e-4",
        "optim.lr=3e-3",
        ["optim.lr=3e-5", "optim.warmup_steps=30", "optim.final_lr_fraction=0.0"],
        capsys,
    )
    test = store.find("inv").tests[0]
    for run in store.seed_runs(test.run_id):  # MLFlowLogger logged into the run hyprun made
        assert "val_loss" in run.data.metrics and run.data.params["lr"] == "0.003"
