"""The tracking server goes away in the middle of a job and comes back: training goes on, what
could not be sent waits on local disk, and everything arrives, once.

The outage lasts until the job has trained its last step into the spool, and at least a few of
the writer's retries (it used to be a fixed 60 s sleep; the job needs ~5 s)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from hyprun.runner.store.tracking import RETRY_S
from tests.helpers import free_port, metric_history, python_env, start_mlflow_server

pytestmark = pytest.mark.slow  # a job against a server that stops and restarts: ~1 min

MIN_OUTAGE_S = 3 * RETRY_S  # the writer meets the dead server more than once
# 16 steps of >= 0.25 s: the outage starts after the first metrics and outlasts the training.
BUDGET = [
    "budget.tokens=16384",
    "budget.eval_every_tokens=4096",
    "budget.eval_sequences=16",
    "data.source.loader_delay_ms=250",
    "tracking.flush_every_s=0.5",
    "tracking.system_metrics_every_s=0",
]


def test_a_server_outage_loses_nothing(tmp_path):
    port, server, job, run_id = _job_logging_to_a_server(tmp_path)
    uri, client = f"http://127.0.0.1:{port}", MlflowClient(f"http://127.0.0.1:{port}")

    server.terminate()
    server.wait(timeout=30)
    down = time.monotonic()
    # Training goes on to its last step while the server is away: that step waits on disk.
    while (last := _last_parked_step(tmp_path)) < 16384:
        assert time.monotonic() - down < 300 and job.poll() is None, f"spooled up to {last}"
        time.sleep(0.5)
    time.sleep(max(0.0, MIN_OUTAGE_S - (time.monotonic() - down)))
    assert job.poll() is None  # done training, waiting to deliver
    [spool] = (tmp_path / "ckpt").glob("*/spool.jsonl")

    server = start_mlflow_server(tmp_path, port)
    try:
        output, _ = job.communicate(timeout=120)
        assert job.returncode == 0, output
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.tags["hyprun.outcome"] == "completed"
        losses = metric_history(uri, run_id, "train/loss")
        assert [s for s, _ in losses] == list(range(1024, 16385, 1024))  # each step once
        assert [s for s, _ in metric_history(uri, run_id, "eval/loss")] == [
            4096,
            8192,
            12288,
            16384,
        ]
        assert not spool.exists()
    finally:
        server.terminate()
        server.wait(timeout=30)


def _last_parked_step(folder) -> int:
    """The last metric step the job parked in its spool (-1: none yet)."""
    steps = [-1]
    for spool in (folder / "ckpt").glob("*/spool.jsonl"):
        for line in spool.read_text().splitlines():
            batch = json.loads(line) if line.endswith("}") else {}  # a line being written
            if batch.get("kind") == "metrics":
                steps += [m[3] for m in batch["items"]]
    return max(steps)


def _job_logging_to_a_server(folder, *overrides: str):
    """(port, server, job process, run id) once a job on a fresh server has logged a loss."""
    port = free_port()
    server = start_mlflow_server(folder, port)
    uri = f"http://127.0.0.1:{port}"
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hyprun.runner.job.train",
            *BUDGET,
            *overrides,
            f"checkpoint.dir={folder}/ckpt",
        ],
        cwd=folder,
        env=python_env(MLFLOW_TRACKING_URI=uri),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    client = MlflowClient(uri)
    deadline = time.monotonic() + 300
    while not (runs := _runs(client)) or not metric_history(uri, runs[0], "train/loss"):
        assert time.monotonic() < deadline and job.poll() is None
        time.sleep(0.2)
    return port, server, job, runs[0]


def _runs(client: MlflowClient) -> list[str]:
    found = client.get_experiment_by_name("hyprun")
    return [r.info.run_id for r in client.search_runs([found.experiment_id])] if found else []


def test_a_server_that_never_returns_leaves_the_evidence_and_the_upload_command(tmp_path):
    port, server, job, run_id = _job_logging_to_a_server(tmp_path, "tracking.outage_grace_s=5")
    uri, client = f"http://127.0.0.1:{port}", MlflowClient(f"http://127.0.0.1:{port}")
    server.terminate()
    server.wait(timeout=30)
    output, _ = job.communicate(timeout=300)
    assert job.returncode == 1, output
    [line] = [ln for ln in output.splitlines() if ln.startswith("hyprun:")]
    assert "has not answered" in line and "hyprun upload" in line
    [spool] = (tmp_path / "ckpt").glob("*/spool.jsonl")
    assert str(spool) in line

    server = start_mlflow_server(tmp_path, port)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "hyprun.runner.cli.main", "upload", str(spool), "--uri", uri],
            cwd=tmp_path,
            env=python_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.tags["hyprun.outcome"] == "completed"
        steps = [s for s, _ in metric_history(uri, run_id, "train/loss")]
        assert steps == list(range(1024, 16385, 1024))
        assert not spool.exists()
    finally:
        server.terminate()
        server.wait(timeout=30)
