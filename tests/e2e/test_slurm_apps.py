"""A user's Hugging Face Trainer app (tests/apps/hf_gpt2) through the local Slurm cluster, with
the same launcher config as our own job (`hydra/launcher=slurm_cpu`): its baseline as one job
array, then a test one of whose jobs `scontrol requeue` interrupts (as preemption does). The
requeued job logs into the same MLflow run, resumes from the Trainer's own checkpoint in the
folder hyprun keeps for it, is counted once, and its held-out losses equal an uninterrupted run's.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hyprun.runner.launch.app import HydraApp, run_app
from hyprun.runner.store.investigation import Store
from tests.helpers import metric_history, python_env

APP = "tests.apps.hf_gpt2.train:main"
# Long enough to requeue a job between its first held-out loss and its end; checkpoints (the
# Trainer's own) at every evaluation, so the rerun resumes instead of starting over.
BUDGET = [
    "training.max_steps=400",
    "training.eval_steps=100",
    "training.logging_steps=50",
    "training.save_steps=100",
    "probe_every=50",
]
NAME = "hf-on-slurm"
pytestmark = [pytest.mark.usefixtures("slurm"), pytest.mark.slow]


def hyprun(*args: str, cwd: Path, uri: str, wait: bool = True):
    command = [sys.executable, "-m", "hyprun.runner.cli.main", *args]
    env = python_env(MLFLOW_TRACKING_URI=uri, MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false")
    if not wait:
        return subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_hf_app_on_slurm_with_a_requeue(mlflow_server, tmp_path, monkeypatch, one_torch_thread):
    store = Store(mlflow_server, "hyprun")
    planted = "training.learning_rate=1e-4"
    done = hyprun(
        "baseline",
        "--app",
        APP,
        planted,
        *BUDGET,
        "hydra/launcher=slurm_cpu",
        "--seeds",
        "2",
        "--investigation",
        NAME,
        cwd=tmp_path,
        uri=mlflow_server,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    state = store.find(NAME)
    assert state.baseline["launcher"] == ["hydra/launcher=slurm_cpu"]
    jobs = store.client.get_run(state.run_id).data.tags["slurm.jobs"].split(",")
    assert len(jobs) == 2 and len({j.split("_")[0] for j in jobs}) == 1  # one job array

    fix = "training.learning_rate=3e-3"
    why = "I think the LR is too low because the held-out loss barely moves"
    command = hyprun(
        "test",
        fix,
        "--why",
        why,
        "--investigation",
        NAME,
        cwd=tmp_path,
        uri=mlflow_server,
        wait=False,
    )
    test = _wait_for(lambda: _submitted(store), "the test's Slurm jobs")
    job = test.tags["slurm.jobs"].split(",")[0]

    def evaluated_once() -> str | None:
        run = next(
            (r for r in store.seed_runs(test.run_id) if r.data.tags["hyprun.seed"] == "0"), None
        )
        if run and metric_history(mlflow_server, run.info.run_id, "eval_loss"):
            return run.info.run_id
        return None

    requeued = _wait_for(evaluated_once, "seed 0's first held-out loss")
    subprocess.run(["scontrol", "requeue", job], check=True)  # as preemption does
    output, _ = command.communicate(timeout=900)
    assert command.returncode == 0, output

    after = store.find(NAME)
    assert len(after.tests) == 1  # counted once
    test = after.tests[0]
    assert test.verdict == "confirmed", test.tags.get("hyprun.reason")
    seeds = [r.data.tags["hyprun.seed"] for r in store.seed_runs(test.run_id)]
    # The requeued attempt logged into its first run, not a new one (rounds may add seeds).
    assert len(seeds) >= 2 and len(seeds) == len(set(seeds)), seeds
    run = store.client.get_run(requeued)
    assert run.data.tags["slurm.restarts"] == "1" and run.data.tags["hyprun.outcome"] == "completed"

    # The same seed, uninterrupted, in this process.
    monkeypatch.chdir(tmp_path)
    app = HydraApp.from_record(state.baseline["app"])
    reference = store.child(after.run_id, "reference", {"hyprun.role": "reference"})
    config = app.job_config(
        mlflow_server, "hyprun", [planted, *BUDGET, fix], 0, reference, "reference", {}
    )
    clean = run_app(config)
    store.finish(reference)  # the session's server is shared: leave no parent RUNNING
    assert clean.status == "completed"
    resumed = store.history(requeued, "eval_loss")
    expected = store.history(clean.run_id, "eval_loss")
    assert [s for s, _ in resumed] == [s for s, _ in expected] == [100, 200, 300, 400]
    assert all(
        math.isclose(a, b, rel_tol=1e-5) for (_, a), (_, b) in zip(resumed, expected, strict=True)
    ), (resumed, expected)


def _submitted(store: Store):
    tests = store.find(NAME).tests
    return tests[0] if tests and tests[0].tags.get("slurm.jobs") else None


def _wait_for(found, what: str, timeout: float = 600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")
