"""A controller killed with SIGKILL in the middle of a test: rerunning the same command resumes
the same test (no second claim), finished seeds are not rerun, the interrupted seed continues in
its MLflow run from its checkpoint, and the verdict equals an uninterrupted run's."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from bench.faults import uninterrupted
from hyprun.diag.effect import change
from hyprun.runner.control.baseline import record_baseline
from hyprun.runner.control.context import DEFAULT_PRIMARY
from hyprun.runner.control.verdicts import decide
from hyprun.runner.store.investigation import Store
from tests.helpers import metric_history, python_env

# 16 steps of >= 0.25 s each: a window to kill the test's jobs mid-run.
BUDGET = [
    "budget.tokens=16384",
    "budget.eval_every_tokens=4096",
    "budget.eval_sequences=16",
    "checkpoint.every_tokens=2048",
    "data.source.loader_delay_ms=250",
]
WHY = "I think the LR is too low because the loss is flat"


def hyprun_test(workdir, uri: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hyprun.runner.cli.main",
            "test",
            "optim.lr=3e-3",
            "--why",
            WHY,
            "--investigation",
            "crash",
            "--max-seeds",  # one look (the fixed rule): the reference below is one look too
            "2",
        ],
        cwd=workdir,
        env=python_env(MLFLOW_TRACKING_URI=uri),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def kill_seed() -> int:
    """The seed of the kill moment: HYPRUN_CRASH_SEED to replay a failure, else a fresh one,
    drawn inside the test (a parameter drawn at collection breaks --lf and pytest-xdist)."""
    seed = int(os.environ.get("HYPRUN_CRASH_SEED") or random.randrange(10**6))
    print(f"kill moment drawn from seed {seed}: replay with HYPRUN_CRASH_SEED={seed}")
    return seed


@pytest.mark.slow
def test_kill_9_of_a_running_test_resumes_to_the_same_verdict(workdir):
    seed = kill_seed()
    uri = f"sqlite:///{workdir}/mlflow.db"
    store = Store(uri, "hyprun")
    state = record_baseline(store, "crash", [*BUDGET, f"checkpoint.dir={workdir}/ckpt"], 2, "")

    first = hyprun_test(workdir, uri)
    deadline = time.monotonic() + 300
    while not (tests := store.find("crash").tests) or not _seed_runs(store, tests[0].run_id):
        assert time.monotonic() < deadline and first.poll() is None, first.stdout.read()
        time.sleep(0.2)
    time.sleep(random.Random(seed).uniform(0.5, 6.0))  # a random moment of the test's life
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()

    again = hyprun_test(workdir, uri)
    output, _ = again.communicate(timeout=600)
    assert again.returncode == 0, output
    assert "resuming the test a crashed controller left running" in output
    state = store.find("crash")
    [test] = state.tests  # resumed, not claimed twice
    assert test.verdict in ("confirmed", "rejected", "inconclusive"), test.tags
    runs = _seed_runs(store, test.run_id)
    assert sorted(runs) == [0, 1]  # one run per seed: nothing rerun from scratch

    # The same seeds uninterrupted, with the same config, elsewhere in the store.
    reference = uninterrupted(store, state, [*BUDGET, "optim.lr=3e-3"], workdir / "reference")
    for s, result in zip((0, 1), reference, strict=True):
        for metric in ("train/loss", "eval/loss"):
            resumed = metric_history(uri, runs[s], metric)
            clean = metric_history(uri, result.run_id, metric)
            assert [p for p, _ in resumed] == [p for p, _ in clean], (seed, metric)
            assert all(
                math.isclose(a, b, rel_tol=1e-6)
                for (_, a), (_, b) in zip(resumed, clean, strict=True)
            )
    straight = decide(store, state, reference, DEFAULT_PRIMARY, [])
    assert test.verdict == straight["status"]
    resumed = store.run(test.run_id).data.metrics["effect/eval_loss"]
    assert resumed == pytest.approx(change(straight), rel=1e-6)


def _seed_runs(store: Store, test_run: str) -> dict[int, str]:
    return {int(r.data.tags["hyprun.seed"]): r.info.run_id for r in store.seed_runs(test_run)}
