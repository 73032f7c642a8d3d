"""Seeds in rounds against real jobs and a real MLflow store: an undecided test grows to its cap,
the baseline seeds it adds are recorded on the investigation and reused by the next test, a
no-op is called what it is, and concurrent claims of one baseline seed leave one recorder."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading

import pytest

import hyprun.diag.verdict
from hyprun.runner.control import controller, rounds
from hyprun.runner.control.baseline import claim_baseline_seed, record_baseline
from hyprun.runner.store.investigation import Store
from tests.helpers import python_env

TINY = ["budget.tokens=8192", "budget.eval_every_tokens=4096", "probes=off"]
WHY = "I think [cause] because [evidence]"


@pytest.fixture
def store(workdir) -> Store:
    return Store(f"sqlite:///{workdir}/mlflow.db", "hyprun")


@pytest.fixture
def undecidable():
    """A table whose boundaries no test can cross (z_confirm 50): every look is inconclusive,
    so a test runs every round its caps allow. One seed added per round. `.undo()` restores
    the shipped table."""
    params = hyprun.diag.verdict.load_params()
    params = dataclasses.replace(
        params,
        z_confirm=50.0,
        sequential=dataclasses.replace(params.sequential, round_seeds=1),
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hyprun.diag.verdict, "load_params", lambda *args: params)
        patch.setattr(rounds, "load_params", lambda *args: params)
        yield patch


@pytest.mark.slow  # 9 training jobs (about 2 min on 2 busy cores): rounds need real seed runs
def test_rounds_add_shared_baseline_seeds_and_a_no_op_says_so(store, workdir, undecidable):
    overrides = [*TINY, "optim.lr=1e-3", f"checkpoint.dir={workdir}/ckpt"]
    state = record_baseline(store, "rounds", overrides, seeds=2, why="")
    first = controller.test(store, "rounds", ["optim.lr=*2"], WHY, max_seeds=3)
    verdict = first.verdict
    assert verdict["status"] == "inconclusive", verdict
    assert verdict["seeds"] == 3 and verdict["rounds_run"] == 2 == verdict["rounds_planned"]
    assert verdict["stopped"] == "seed cap (3 per side)"
    assert verdict["n_baseline"] == 3 and verdict["n_test"] == 3
    assert verdict["baseline_tokens_added"] == 8192 and verdict["tokens_spent"] == 3 * 8192
    # the added seed is part of the recorded baseline, on the investigation
    state = store.refresh(state)
    key = f"baseline.{state.baseline['config_hash']}.seed.2"
    added = state.params[key]
    assert state.baseline_seeds == 3 and state.baseline_run(2) == added
    run = store.run(added)
    assert run.data.tags["hyprun.role"] == "baseline" and run.data.tags["hyprun.seed"] == "2"
    assert run.data.tags["mlflow.parentRunId"] == state.run_id
    # the next test reuses it: no baseline job of its own
    second = controller.test(store, "rounds", ["optim.lr=*0.5"], WHY, max_seeds=3)
    assert second.verdict["baseline_tokens_added"] == 0 and second.verdict["seeds"] == 3
    baseline_runs = [r for r in store.seed_runs(state.run_id)]
    assert sorted(r.data.tags["hyprun.seed"] for r in baseline_runs) == ["0", "1", "2"]

    undecidable.undo()  # the shipped table again
    noop = controller.test(store, "rounds", ["ds.wall_clock_breakdown=true"], WHY)
    assert noop.verdict["status"] == "rejected" and noop.verdict["identical"], noop.verdict
    assert noop.verdict["reason"].startswith("no effect (identical to baseline)")
    assert noop.verdict["stopped"] == "no effect: identical to baseline"
    assert noop.verdict["seeds"] == 2  # no round was added to a no-op

    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "hyprun.runner.cli.main",
            "status",
            "--json",
            "--investigation",
            "rounds",
        ],
        env=python_env(MLFLOW_TRACKING_URI=store.uri),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert status.returncode == 0, status.stderr
    rows = json.loads(status.stdout)["tests"]
    assert [(r["seeds"], r["stopped"]) for r in rows] == [
        ("3", "seed cap (3 per side)"),
        ("3", "seed cap (3 per side)"),
        ("2", "no effect: identical to baseline"),
    ]


def test_caps_are_checked_before_anything_runs(store, workdir):
    overrides = [*TINY, "optim.lr=1e-3", f"checkpoint.dir={workdir}/ckpt"]
    state = record_baseline(store, "caps", overrides, seeds=1, why="")
    with pytest.raises(controller.BadInput, match="--max-tokens 100 is below one round"):
        controller.test(store, "caps", ["optim.lr=*2"], WHY, max_tokens=100)
    with pytest.raises(controller.BadInput, match="--max-seeds 0"):
        controller.test(store, "caps", ["optim.lr=*2"], WHY, max_seeds=0)
    assert store.refresh(state).tests == []  # nothing claimed, nothing run


def test_concurrent_claims_of_a_baseline_seed_leave_one_recorder(store, workdir):
    state = record_baseline(store, "claims", [*TINY, f"checkpoint.dir={workdir}/ckpt"], 1, "")
    won: list[bool] = []
    threads = [
        threading.Thread(target=lambda: won.append(claim_baseline_seed(store, state, 5)))
        for _ in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(won) == [False] * 5 + [True]
    # a claim held by a controller of this host that is gone is taken over at the next attempt
    key = f"baseline.{state.baseline['config_hash']}.claim.6.0"
    assert store.once(state.run_id, key, "nohost-but-this:999999999:dead")
    assert not claim_baseline_seed(store, state, 6)  # another host: cannot tell, so wait
    import socket

    key = f"baseline.{state.baseline['config_hash']}.claim.7.0"
    assert store.once(state.run_id, key, f"{socket.gethostname()}:999999999:dead")
    assert claim_baseline_seed(store, state, 7)  # this host, process gone: taken over
