"""The sbatch templates in slurm/: valid bash, and slurm/8xa100.sbatch run for real on the local
CPU cluster (slurm/local/up.sh), sized down on the sbatch command line (which wins over #SBATCH).

One job covers the template's life cycle: it trains, gets the time-limit signal, checkpoints,
requeues itself, resumes into the same MLflow run and completes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.helpers import ROOT, python_env

TEMPLATES = ["slurm/8xa100.sbatch", "slurm/multinode.sbatch"]
# Two CPU ranks (one per CPU) instead of eight GPUs.
FIT_HERE = ["--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1", "--time=5"]
# 16 steps of at least 0.4 s: time to signal the job between its first eval and its end.
TINY = [
    "budget=tiny",
    "budget.tokens=32768",
    "budget.eval_every_tokens=4096",
    "budget.eval_sequences=32",
    "data.source.loader_delay_ms=400",
]


@pytest.mark.parametrize("template", TEMPLATES)
def test_template_is_valid_bash(template):
    done = subprocess.run(["bash", "-n", ROOT / template], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.usefixtures("slurm")
def test_8xa100_template_requeues_itself_and_resumes_on_the_local_cluster(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # The job runs in the repository root: keep its artifacts out of ./mlruns there.
    MlflowClient(uri).create_experiment("hyprun", artifact_location=str(tmp_path / "artifacts"))
    env = python_env(MLFLOW_TRACKING_URI=uri, DS_ACCELERATOR="cpu", HYPRUN_PYTHON=sys.executable)
    out = tmp_path / "job.out"
    submit = [
        "sbatch",
        "--parsable",
        *FIT_HERE,
        f"--output={out}",
        "slurm/8xa100.sbatch",
        *TINY,
        f"checkpoint.dir={tmp_path}/ckpt",
        f"hydra.run.dir={tmp_path}/hydra",
    ]
    job = _run(submit, cwd=ROOT, env=env).split(";")[0]
    try:
        # The first held-out loss is out: the job is in its training loop, its handler set.
        _wait(lambda: re.search(r"^step \d+/", _read(out), re.M), job, out, "the first eval")
        # What `--signal=B:USR1@120` sends the batch script before the time limit.
        _run(["scancel", "--signal=USR1", "--batch", job])
        _wait(lambda: _squeue(job) == "PENDING", job, out, "the job to requeue itself")
        # A requeued job waits cred_expire (30 s on the local cluster) before it starts again;
        # starting it earlier (scontrol update StartTime=now) races the old attempt's cleanup
        # and the new one fails with a revoked credential.
        _wait(lambda: _squeue(job) == "", job, out, "the second attempt to end")
    finally:
        subprocess.run(["scancel", job], capture_output=True, check=False)

    log = _read(out)
    assert "requeueing job" in log and "resuming run" in log, log
    deadline = time.monotonic() + 30  # accounting trails squeue by a moment
    while _attempts(job) != ["REQUEUED", "COMPLETED"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _attempts(job) == ["REQUEUED", "COMPLETED"], log
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("hyprun").experiment_id])
    assert run.info.status == "FINISHED", log
    tags = run.data.tags
    assert tags["hyprun.outcome"] == "completed" and tags["hyprun.world_size"] == "2"
    assert tags["slurm.job_id"] == job and tags["slurm.restarts"] == "1"


def _run(command: list[str], **kwargs) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, **kwargs)
    assert done.returncode == 0, f"{' '.join(command)}: {done.stderr}"
    return done.stdout.strip()


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _squeue(job: str) -> str:
    """The job's state while Slurm schedules it; empty once it has ended."""
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()


def _attempts(job: str) -> list[str]:
    """The state of every attempt of the job, as accounting recorded it."""
    return _run(["sacct", "-j", job, "-X", "-D", "-n", "-o", "State"]).split()


def _wait(condition: Callable[[], object], job: str, out: Path, what: str, timeout=240) -> None:
    """Until `condition()`; fails at the timeout or when the job ended without meeting it."""
    deadline = time.monotonic() + timeout
    while not condition():
        ended = _squeue(job) == ""
        if ended and condition():  # it met the condition between the two reads (e.g. it ended)
            return
        if ended or time.monotonic() > deadline:
            why = "the job ended" if ended else "timed out"
            pytest.fail(f"{why} waiting for {what} (job {job}: {_attempts(job)})\n{_read(out)}")
        time.sleep(0.5)
