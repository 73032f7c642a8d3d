"""The controller on a real Slurm cluster (CI starts one with slurm/local/up.sh).

One investigation, its baseline recorded through `hydra/launcher=slurm_cpu`; then a hypothesis test,
a 4-trial sweep as one job array, a test cancelled by `scancel` (an error, not a strike) and a test
whose job `scontrol requeue` interrupts (it resumes into the same MLflow runs, counted once, with
the metrics of an uninterrupted run).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hyprun.runner.control.context import job_config
from hyprun.runner.launch.launchers import Failed, Job, Slurm, launcher_params, sacct_states
from hyprun.runner.store.investigation import Store
from tests.helpers import metric_history, python_env

# Slow enough to act on a running job (0.4 s per step, 16 steps), small enough for CI.
BUDGET = [
    "budget.tokens=16384",
    "budget.eval_every_tokens=4096",
    "budget.eval_sequences=32",
    "checkpoint.every_tokens=2048",
    "data.source.loader_delay_ms=400",
]
NAME = "on-slurm"
pytestmark = pytest.mark.usefixtures("slurm")


def hyprun(*args: str, cwd: Path, uri: str, wait: bool = True, **extra_env: str):
    command = [sys.executable, "-m", "hyprun.runner.cli.main", *args]
    env = python_env(MLFLOW_TRACKING_URI=uri, MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false")
    env.update(extra_env)
    if not wait:
        return subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def investigation(mlflow_server: str, tmp_path_factory: pytest.TempPathFactory):
    """(folder, store) of an investigation whose 2-seed baseline ran as a Slurm job array."""
    folder = tmp_path_factory.mktemp("slurm")
    done = hyprun(
        "baseline",
        *BUDGET,
        "hydra/launcher=slurm_cpu",
        "--seeds",
        "2",
        "--investigation",
        NAME,
        cwd=folder,
        uri=mlflow_server,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return folder, Store(mlflow_server, "hyprun")


def new_test(store: Store, known: int, timeout: float = 300):
    """The investigation's test number `known + 1` once it exists and has Slurm jobs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tests = store.find(NAME).tests
        if len(tests) > known and tests[known].tags.get("slurm.jobs"):
            return tests[known]
        time.sleep(1)
    raise AssertionError("the test was not submitted")


def seed_runs(store: Store, run_id: str) -> dict[int, str]:
    return {int(r.data.tags["hyprun.seed"]): r.info.run_id for r in store.seed_runs(run_id)}


# Loaded by the controller's interpreter (sitecustomize): boundaries no test can cross, so a test
# runs every round its seed cap allows (a huge effect is otherwise decided at the first look).
UNDECIDABLE = """
import dataclasses
import hyprun.diag.verdict as verdict
shipped = verdict.load_params
verdict.load_params = lambda *args: dataclasses.replace(shipped(*args), z_confirm=50.0)
"""


def test_baseline_and_test_rounds_run_through_slurm(investigation, mlflow_server, tmp_path):
    folder, store = investigation
    (tmp_path / "sitecustomize.py").write_text(UNDECIDABLE)
    state = store.find(NAME)
    assert state.baseline["launcher"] == ["hydra/launcher=slurm_cpu"]
    baseline_jobs = store.client.get_run(state.run_id).data.tags["slurm.jobs"].split(",")
    assert len(baseline_jobs) == 2 and len({j.split("_")[0] for j in baseline_jobs}) == 1

    done = hyprun(
        "test",
        "optim.lr=3e-3",
        "--why",
        "I think the LR is low because loss is flat",
        "--investigation",
        NAME,
        "--max-seeds",
        "4",
        cwd=folder,
        uri=mlflow_server,
        PYTHONPATH=f"{tmp_path}:{python_env()['PYTHONPATH']}",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    state = store.find(NAME)
    test = state.tests[0]
    assert test.verdict == "inconclusive", test.tags.get("hyprun.reason")
    # undecided at 2 seeds a side: a second round added test seeds 2-3 and baseline seeds 2-3,
    # as ONE job array, and stopped at the seed cap
    assert test.tags["hyprun.seeds"] == "4", test.tags
    assert test.tags["hyprun.stopped"] == "seed cap (4 per side)", test.tags
    jobs = test.tags["slurm.jobs"].split(",")
    runs = store.seed_runs(test.run_id)
    added = [store.run(state.baseline_run(seed)) for seed in (2, 3)]
    assert all(r.data.tags["hyprun.role"] == "baseline" for r in added)
    assert sorted(r.data.tags["slurm.job_id"] for r in [*runs, *added]) == sorted(jobs)
    second = [r for r in [*runs, *added] if int(r.data.tags["hyprun.seed"]) >= 2]
    assert (
        len(second) == 4 and len({r.data.tags["slurm.job_id"].split("_")[0] for r in second}) == 1
    )

    status = hyprun("status", "--json", "--investigation", NAME, cwd=folder, uri=mlflow_server)
    row = json.loads(status.stdout)["tests"][0]
    assert row["slurm"] == dict.fromkeys(jobs, "COMPLETED")


def test_sweep_of_four_trials_runs_as_one_job_array(investigation, mlflow_server):
    folder, store = investigation
    before = store.find(NAME)
    done = hyprun(
        "sweep",
        "optim.lr=tag(log, interval(1e-4, 1e-2))",
        "--trials",
        "4",
        "--why",
        "I think the LR is off because loss is flat",
        "--investigation",
        NAME,
        cwd=folder,
        uri=mlflow_server,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    state = store.find(NAME)
    sweep = state.tests[-1]
    jobs = sweep.tags["slurm.jobs"].split(",")
    assert len(jobs) == 8 and len({j.split("_")[0] for j in jobs}) == 1  # 4 trials x 2 seeds
    trials = [
        r for r in store._children(sweep.run_id) if r.data.tags["hyprun.role"] == "sweep-trial"
    ]
    assert len(trials) == 4
    path = store.client.download_artifacts(sweep.run_id, "verdict.json", str(folder))
    verdict = json.loads(Path(path).read_text())
    assert verdict["looks"] == 4 and "Bonferroni" in verdict["reason"]
    assert sweep.verdict in ("confirmed", "rejected", "inconclusive")
    assert state.strikes - before.strikes <= 1  # one hypothesis, one strike at most


def test_scancel_of_a_running_test_is_an_error_not_a_strike(investigation, mlflow_server):
    folder, store = investigation
    before = store.find(NAME)
    why = "I think the LR is low because loss is flat"
    command = hyprun(
        "test",
        "optim.lr=2e-3",
        "--why",
        why,
        "--investigation",
        NAME,
        cwd=folder,
        uri=mlflow_server,
        wait=False,
    )
    test = new_test(store, len(before.tests))
    jobs = test.tags["slurm.jobs"].split(",")
    _wait_for(lambda: sacct_states(jobs).get(jobs[0]) == "RUNNING", "a running job")
    subprocess.run(["scancel", jobs[0]], check=True)
    output, _ = command.communicate(timeout=600)
    assert command.returncode == 1, output
    after = store.find(NAME)
    test = next(t for t in after.tests if t.run_id == test.run_id)
    assert test.verdict == "error" and "CANCELLED" in test.tags["hyprun.reason"]
    assert after.strikes == before.strikes
    assert store.client.get_run(test.run_id).info.status == "FAILED"


def test_requeued_and_time_limited_jobs_resume_and_match_an_uninterrupted_run(
    investigation, mlflow_server
):
    folder, store = investigation
    before = store.find(NAME)
    delta = "optim.lr=5e-4"
    why = "I think the LR is high because loss spikes"
    command = hyprun(
        "test",
        delta,
        "--why",
        why,
        "--investigation",
        NAME,
        "--max-seeds",  # one look: the requeue of the first round's jobs is the subject
        "2",
        cwd=folder,
        uri=mlflow_server,
        wait=False,
    )
    test = new_test(store, len(before.tests))
    job = test.tags["slurm.jobs"].split(",")[0]

    def evaluated_once() -> bool:
        runs = seed_runs(store, test.run_id)
        return len(runs) == 2 and all(
            metric_history(mlflow_server, r, "eval/loss") for r in runs.values()
        )

    _wait_for(evaluated_once, "both seeds' first held-out loss")
    subprocess.run(["scontrol", "requeue", job], check=True)  # as preemption does
    # Seed 1 gets the warning Slurm sends before a time limit: it checkpoints, requeues itself.
    other = test.tags["slurm.jobs"].split(",")[1]
    subprocess.run(["scancel", "--signal=USR2", other], check=True)
    output, _ = command.communicate(timeout=900)
    assert command.returncode == 0, output

    after = store.find(NAME)
    test = next(t for t in after.tests if t.run_id == test.run_id)
    assert test.verdict in ("confirmed", "rejected", "inconclusive"), test.tags
    assert len(after.tests) == len(before.tests) + 1  # counted once
    runs = {
        seed: store.client.get_run(run_id) for seed, run_id in seed_runs(store, test.run_id).items()
    }
    for run in runs.values():
        assert (
            run.data.tags["slurm.restarts"] == "1"
            and run.data.tags["hyprun.outcome"] == "completed"
        )
        steps = [s for s, _ in metric_history(mlflow_server, run.info.run_id, "train/loss")]
        assert steps == sorted(set(steps))
    requeued = runs[0]

    # The same job, uninterrupted, on the same cluster.
    overrides = [*BUDGET, delta]
    reference_parent = store.child(after.run_id, "reference", {"hyprun.role": "reference"})
    cfg = job_config(store, overrides, 0, reference_parent, "reference · seed 0", {})
    cfg.checkpoint.dir = str(folder / "reference-checkpoints")
    params = launcher_params(["hydra/launcher=slurm_cpu"])
    [result] = Slurm(params, folder / ".hyprun/slurm/reference", "reference").run([Job(cfg)])
    store.finish(reference_parent)  # the session's server is shared: leave no parent RUNNING
    assert not isinstance(result, Failed), result.reason
    assert result.status == "completed"
    for metric in ("train/loss", "eval/loss"):
        resumed = metric_history(mlflow_server, requeued.info.run_id, metric)
        clean = metric_history(mlflow_server, result.run_id, metric)
        assert [s for s, _ in resumed] == [s for s, _ in clean]  # every step exactly once
        assert all(
            math.isclose(a, b, rel_tol=1e-6) for (_, a), (_, b) in zip(resumed, clean, strict=True)
        )


def _wait_for(condition, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_launcher_configs_submit_a_hydra_multirun(mlflow_server, tmp_path):
    """`python -m hyprun.runner.job.train -m ... hydra/launcher=slurm_cpu`:
    hydra-submitit-launcher runs each job of the sweep on Slurm with the same launcher config
    the controller uses."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hyprun.runner.job.train",
            "-m",
            "hydra/launcher=slurm_cpu",
            "budget.tokens=2048",
            "budget.eval_every_tokens=1024",
            "budget.eval_sequences=16",
            "optim.lr=1e-3,3e-3",
            "tracking.experiment=multirun",
            f"hydra.sweep.dir={tmp_path}/m",
        ],
        cwd=tmp_path,
        env=python_env(MLFLOW_TRACKING_URI=mlflow_server),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    client = MlflowClient(mlflow_server)
    runs = client.search_runs([client.get_experiment_by_name("multirun").experiment_id])
    assert sorted(r.data.params["optim.lr"] for r in runs) == ["0.001", "0.003"]
    assert all(r.info.status == "FINISHED" and "_" in r.data.tags["slurm.job_id"] for r in runs)


def test_hostile_names_and_overrides_never_reach_a_shell(mlflow_server, tmp_path):
    """`$(...)`, backquotes, quotes, `;` and newlines in an investigation name and an override
    travel as data (submitit's pickle, a sanitised job name): nothing runs, the value arrives."""
    marker = tmp_path / "pwned"
    hostile = f"x$(touch {marker}); `touch {marker}` \"q\" 'q'\ntouch {marker}"
    quoted = hostile.replace("\\", "\\\\").replace("'", "\\'")
    done = hyprun(
        "baseline",
        "budget.tokens=2048",
        "budget.eval_every_tokens=1024",
        "budget.eval_sequences=16",
        "hydra/launcher=slurm_cpu",
        f"checkpoint.dir='{tmp_path}/{quoted}'",
        "--seeds",
        "1",
        "--investigation",
        hostile,
        cwd=tmp_path,
        uri=mlflow_server,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not marker.exists()
    state = Store(mlflow_server, "hyprun").find(hostile)
    [seed] = state.baseline["seed_runs"]
    params = MlflowClient(mlflow_server).get_run(seed).data.params
    assert params["checkpoint.dir"] == f"{tmp_path}/{hostile}"
    job = MlflowClient(mlflow_server).get_run(seed).data.tags["slurm.job_id"]
    name = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "JobName", "-j", job.split("_")[0]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert name.startswith("hyprun-x-touch-") and "\n" not in name and "$" not in name
