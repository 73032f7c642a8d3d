"""Reading a run's config back leaves nothing behind and prints nothing (issue 25, item 8)."""

from __future__ import annotations

import subprocess
import sys
import tempfile

from mlflow.tracking import MlflowClient

from hyprun.runner.store.tracking import read_run
from tests.helpers import python_env


def _recorded_run(uri: str) -> str:
    """A run with a config.yaml artifact, as the job records one (no training needed)."""
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("reads")
    run_id = client.create_run(experiment).info.run_id
    client.log_text(run_id, "optim:\n  lr: 0.001\n", "config.yaml")
    client.set_terminated(run_id)
    return run_id


def test_reading_a_config_leaves_no_folder_behind(workdir, monkeypatch):
    scratch = workdir / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # ours alone: others share /tmp
    uri = f"sqlite:///{workdir}/mlflow.db"
    run_id = _recorded_run(uri)
    for _ in range(3):
        config, _, _ = read_run(uri, run_id)
    assert config == {"optim": {"lr": 0.001}}
    assert list(scratch.iterdir()) == []


def test_reading_a_config_prints_no_progress_bar(workdir):
    """MLflow's 'Downloading artifacts' bars went to stderr four times per report."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    run_id = _recorded_run(uri)
    env = python_env()
    env.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
    read = (
        "import sys; from hyprun.runner.store.tracking import read_run; "
        f"print(read_run({uri!r}, {run_id!r})[0])"
    )
    done = subprocess.run(
        [sys.executable, "-c", read], env=env, capture_output=True, text=True, check=True
    )
    assert "0.001" in done.stdout
    assert "Downloading artifacts" not in done.stderr, done.stderr
