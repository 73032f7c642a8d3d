"""The multi-node path on two Slurm nodes of one machine (slurm/local/up_two_nodes.sh: two slurmd,
each in its own network and UTS namespace, so ranks meet over TCP at the first node's address).

slurm/multinode.sbatch in its CPU form (its GPU lines overridden on sbatch's command line) runs
the built-in job as 2 nodes x 2 tasks on gloo, as one MLflow run whose global gradient norm is a
single process's on the same batch; a time-limit signal requeues it and it resumes into the same
run. Through the controller, a hypothesis test's seeds each run as a 2-node job, and a rank
killed on the second node ends its test as an error, not a strike, within a bounded time.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hyprun.runner.job.train import run
from hyprun.runner.launch.launchers import sacct_states
from hyprun.runner.store.investigation import Store
from tests.e2e.test_slurm import _wait_for, hyprun, seed_runs
from tests.helpers import ROOT, job_config, metric_history, python_env

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm")]

# The template's GPU lines, overridden: what its comment tells a CPU partition to pass.
CPU_FORM = ["--gpus-per-node=0", "--ntasks-per-node=2", "--cpus-per-task=1"]
# 4 ranks x micro batch 4: the 16 sequences one process sees at its default micro batch.
BUDGET = [
    "budget.tokens=16384",
    "budget.eval_every_tokens=8192",
    "budget.eval_sequences=32",
    "checkpoint.every_tokens=4096",
]
RANKS = ["ds.micro_batch=4"]
TWO_NODES = [
    "hydra/launcher=slurm_cpu",
    "hydra.launcher.nodes=2",
    "hydra.launcher.tasks_per_node=2",
]
NAME = "on-two-nodes"
WHY = "I think the LR is low because loss is flat"


@pytest.fixture(autouse=True)
def on_two_nodes(two_node_cluster: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's commands, here and in every subprocess, address the two-node cluster."""
    monkeypatch.setenv("SLURM_CONF", two_node_cluster)


def sbatch(folder: Path, uri: str, *overrides: str) -> str:
    """Submit slurm/multinode.sbatch in its CPU form from `folder`; its job id."""
    env = python_env(MLFLOW_TRACKING_URI=uri, HYPRUN_PYTHON=sys.executable)
    command = ["sbatch", "--parsable", *CPU_FORM, str(ROOT / "slurm/multinode.sbatch"), *overrides]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def wait_until_over(job: str, timeout: float = 600) -> str:
    """The final state of a Slurm job (a requeued one is waited through)."""
    over = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
    _wait_for(lambda: sacct_states([job]).get(job) in over, f"job {job} to end", timeout)
    return sacct_states([job])[job]


def the_run(uri: str, experiment: str):
    """The one run of an experiment (a job of several ranks makes one run, rank 0's)."""
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


@pytest.fixture(scope="module")
def two_node_run(two_node_cluster, bridge_mlflow_server, tmp_path_factory):
    """(run, seconds) of the built-in job run by slurm/multinode.sbatch on 2 nodes x 2 tasks."""
    folder = tmp_path_factory.mktemp("multinode")
    started = time.monotonic()
    with pytest.MonkeyPatch.context() as patch:  # module scope: before the autouse fixture
        patch.setenv("SLURM_CONF", two_node_cluster)
        job = sbatch(folder, bridge_mlflow_server, *BUDGET, *RANKS, "tracking.experiment=two")
        state = wait_until_over(job)
    seconds = time.monotonic() - started
    log = (folder / f"slurm-hyprun-{job}.out").read_text()
    assert state == "COMPLETED", log
    assert f"4 tasks, master node1:{20000 + int(job) % 20000}" in log  # ranks meet at node1
    return the_run(bridge_mlflow_server, "two"), seconds


def test_srun_spans_two_hosts():
    done = subprocess.run(
        ["srun", "-N2", "hostname"], capture_output=True, text=True, timeout=120, check=True
    )
    assert sorted(done.stdout.split()) == ["node1", "node2"]


def test_two_nodes_make_one_run_with_one_process_gradient_norm(
    two_node_run, bridge_mlflow_server, tmp_path
):
    run_two, seconds = two_node_run
    tags = run_two.data.tags
    assert tags["hyprun.world_size"] == "4" and tags["slurm.nodes"] == "node[1-2]"
    assert tags["hyprun.outcome"] == "completed" and run_two.info.status == "FINISHED"
    print(f"2 nodes x 2 tasks: {seconds:.0f} s from sbatch to COMPLETED")

    uri = bridge_mlflow_server
    one = run(job_config(tmp_path, *BUDGET, "tracking.experiment=one", uri=uri))
    two_id = run_two.info.run_id
    for metric, tolerance in (("grad/norm", 1e-5), ("train/loss", 1e-4)):
        two = metric_history(uri, two_id, metric)
        single = metric_history(uri, one.run_id, metric)
        assert [s for s, _ in two] == [s for s, _ in single]
        assert [v for _, v in two] == pytest.approx([v for _, v in single], rel=tolerance)


def test_time_limit_signal_requeues_into_the_same_run(two_node_run, bridge_mlflow_server, tmp_path):
    """USR1 to the batch shell, as `--signal=B:USR1@120` sends it: the ranks checkpoint, the
    script requeues the job, and the rerun resumes into its run: every point once, each equal to
    the uninterrupted run's."""
    uri = bridge_mlflow_server
    slow = "data.source.loader_delay_ms=500"  # ~8 s of steps: time to signal a running job
    job = sbatch(tmp_path, uri, *BUDGET, *RANKS, slow, "tracking.experiment=requeued")
    client = MlflowClient(uri)

    def training() -> bool:
        experiment = client.get_experiment_by_name("requeued")
        runs = client.search_runs([experiment.experiment_id]) if experiment else []
        return bool(runs and metric_history(uri, runs[0].info.run_id, "train/loss"))

    _wait_for(training, "the first training loss")
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True, timeout=60)
    signalled = time.monotonic()
    assert wait_until_over(job) == "COMPLETED"
    print(f"USR1 to COMPLETED, through the requeue: {time.monotonic() - signalled:.0f} s")
    log = (tmp_path / f"slurm-hyprun-{job}.out").read_text()
    assert "requeueing job" in log and "attempt 1" in log and "resuming run" in log, log

    requeued = the_run(uri, "requeued")
    assert requeued.data.tags["slurm.restarts"] == "1"
    assert requeued.data.tags["hyprun.outcome"] == "completed"
    clean_id = two_node_run[0].info.run_id
    for metric in ("train/loss", "eval/loss"):
        resumed = metric_history(uri, requeued.info.run_id, metric)
        clean = metric_history(uri, clean_id, metric)
        assert [s for s, _ in resumed] == [s for s, _ in clean]  # no point lost or doubled
        assert all(
            math.isclose(a, b, rel_tol=1e-6) for (_, a), (_, b) in zip(resumed, clean, strict=True)
        )


@pytest.fixture(scope="module")
def investigation(two_node_cluster, bridge_mlflow_server, tmp_path_factory):
    """(folder, store) of an investigation whose 2-seed baseline ran as 2-node jobs."""
    folder = tmp_path_factory.mktemp("two-nodes")
    started = time.monotonic()
    done = hyprun(
        "baseline",
        *BUDGET,
        *RANKS,
        *TWO_NODES,
        "--seeds",
        "2",
        "--investigation",
        NAME,
        cwd=folder,
        uri=bridge_mlflow_server,
        SLURM_CONF=two_node_cluster,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"a 2-seed baseline of 2-node jobs: {time.monotonic() - started:.0f} s")
    return folder, Store(bridge_mlflow_server, "hyprun")


def submit_test(investigation, uri: str, delta: str, wait: bool = True):
    """`hyprun test DELTA` in the investigation, at most 2 seeds a side (one look)."""
    folder, _ = investigation
    args = ["test", delta, "--why", WHY, "--investigation", NAME, "--max-seeds", "2"]
    return hyprun(*args, cwd=folder, uri=uri, wait=wait)


def test_hypothesis_test_runs_each_seed_as_a_two_node_job(investigation, bridge_mlflow_server):
    _, store = investigation
    known = len(store.find(NAME).tests)
    started = time.monotonic()
    done = submit_test(investigation, bridge_mlflow_server, "optim.lr=3e-3")
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"a 2-seed test of 2-node jobs: {time.monotonic() - started:.0f} s")
    state = store.find(NAME)
    test = state.tests[known]
    assert test.verdict in ("confirmed", "rejected", "inconclusive"), test.tags
    jobs = test.tags["slurm.jobs"].split(",")
    baseline = [store.run(state.baseline_run(seed)) for seed in (0, 1)]
    runs = [store.run(run_id) for run_id in seed_runs(store, test.run_id).values()]
    assert len(runs) == 2 and sorted(r.data.tags["slurm.job_id"] for r in runs) == sorted(jobs)
    for seed_run in [*baseline, *runs]:
        assert seed_run.data.tags["hyprun.world_size"] == "4"
        assert seed_run.data.tags["slurm.nodes"] == "node[1-2]"


def rank_pid(job: str, rank: int) -> tuple[int, str]:
    """(pid, node) of one rank of a Slurm array job `MAIN_TASK`: both nodes' processes are this
    machine's, each carrying its task's Slurm variables."""
    main, task = job.split("_")
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            items = environ.read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        env = dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)
        if (
            env.get("SLURM_ARRAY_JOB_ID") == main
            and env.get("SLURM_ARRAY_TASK_ID") == task
            and env.get("SLURM_STEP_ID", "batch") != "batch"
            and env.get("SLURM_PROCID") == str(rank)
        ):
            return int(environ.parent.name), env["SLURMD_NODENAME"]
    raise AssertionError(f"no rank {rank} of job {job} found")


def test_rank_killed_on_the_second_node_is_an_error_not_a_strike(
    investigation, bridge_mlflow_server
):
    _, store = investigation
    before = store.find(NAME)
    command = submit_test(investigation, bridge_mlflow_server, "optim.lr=2e-3", wait=False)
    known = len(before.tests)
    _wait_for(
        lambda: (
            len(store.find(NAME).tests) > known
            and store.find(NAME).tests[known].tags.get("slurm.jobs")
        ),
        "the test's jobs",
    )
    test = store.find(NAME).tests[known]
    job = test.tags["slurm.jobs"].split(",")[0]

    def training() -> bool:
        runs = seed_runs(store, test.run_id)
        return 0 in runs and bool(metric_history(bridge_mlflow_server, runs[0], "train/loss"))

    _wait_for(training, "seed 0's first training loss")
    pid, node = rank_pid(job, 2)
    assert node == "node2"
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    output, _ = command.communicate(timeout=600)
    seconds = time.monotonic() - killed
    print(f"rank 2 killed on node2: the controller ended {seconds:.0f} s later: {output[-300:]}")
    assert command.returncode == 1, output
    after = store.find(NAME)
    test = next(t for t in after.tests if t.run_id == test.run_id)
    assert test.verdict == "error" and "FAILED" in test.tags["hyprun.reason"], test.tags
    assert after.strikes == before.strikes
    assert seconds < 180  # bounded: no collective waits for the dead rank
