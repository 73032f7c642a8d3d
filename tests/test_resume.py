"""Interrupted jobs resume into the same MLflow run and end exactly where an uninterrupted one does.

The jobs run as real subprocesses (`python -m hyprun.runner.job.train`) and are stopped with
real signals.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import metric_history, python_env

pytestmark = pytest.mark.slow  # jobs killed and resumed in subprocesses

TOKENS = 131072  # 128 steps of 1024 tokens: long enough to be interrupted mid-run
OVERRIDES = [
    f"budget.tokens={TOKENS}",
    "budget.eval_every_tokens=32768",
    "budget.eval_sequences=32",
    "checkpoint.every_tokens=16384",
    "tracking.flush_every_s=0.2",
]


def start(workdir: Path, experiment: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hyprun.runner.job.train",
            *OVERRIDES,
            f"tracking.uri=sqlite:///{workdir}/mlflow.db",
            f"tracking.experiment={experiment}",
            f"checkpoint.dir={workdir}/ckpt",
        ],
        cwd=workdir,
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(job: subprocess.Popen) -> tuple[int, str]:
    out, _ = job.communicate(timeout=600)
    return job.returncode, out


def runs(workdir: Path, experiment: str):
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir}/mlflow.db")
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id]) if found else []


def wait_for_checkpoint(workdir: Path, job: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while not list((workdir / "ckpt").glob("*/latest")):
        assert job.poll() is None, f"job ended before its first checkpoint: {job.communicate()[0]}"
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[tuple[int, float]]:
    """The train/loss history of an uninterrupted run."""
    workdir = tmp_path_factory.mktemp("reference")
    code, out = finish(start(workdir, "reference"))
    assert code == 0, out
    (run,) = runs(workdir, "reference")
    return metric_history(f"sqlite:///{workdir}/mlflow.db", run.info.run_id, "train/loss")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_interrupted_job_resumes_to_the_same_result(workdir, reference, stop):
    job = start(workdir, "interrupted")
    wait_for_checkpoint(workdir, job)
    job.send_signal(stop)
    code, out = finish(job)
    assert code == (75 if stop == signal.SIGTERM else -signal.SIGKILL), out
    (first,) = runs(workdir, "interrupted")
    assert first.info.status == ("KILLED" if stop == signal.SIGTERM else "RUNNING")

    code, out = finish(start(workdir, "interrupted"))  # the same command again
    assert code == 0, out
    assert "resuming run" in out
    (run,) = runs(workdir, "interrupted")  # the same run, not a second one
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    history = metric_history(f"sqlite:///{workdir}/mlflow.db", run.info.run_id, "train/loss")
    steps = [s for s, _ in history]
    assert steps == list(range(1024, TOKENS + 1, 1024)), "a metric step is missing or duplicated"
    assert [v for _, v in history] == pytest.approx([v for _, v in reference], rel=1e-6)
    assert not list((workdir / "ckpt").glob("*/latest")), "a completed job keeps no checkpoint"
