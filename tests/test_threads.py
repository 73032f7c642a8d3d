"""Thread counts sized from the CPU share the process has (runner/job/threads.py, issue 25)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from hyprun.runner.errors import BadInput
from hyprun.runner.job import threads
from hyprun.runner.job.train import run
from tests.helpers import after_importing_runner, job_config, python_env

AFFINITY = len(os.sched_getaffinity(0))


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_a_process_pinned_to_one_cpu_gets_one_thread():
    """A real affinity mask, set by taskset as Slurm's or a container's cpuset would."""
    read = "from hyprun.runner.job.threads import cpu_share; print(cpu_share({}).count)"
    done = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", read],
        env=python_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "1"


def test_the_share_on_this_machine_is_its_affinity_within_its_cgroup_quota():
    quota = threads.cgroup_quota()
    expected = min(AFFINITY, int(quota)) if quota else AFFINITY
    assert threads.cpu_share({}).count == max(1, expected)


def _cgroup(root, relative: str, name: str, text: str) -> None:
    folder = root / relative
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def test_cgroup_v2_quota_is_read_at_the_process_cgroup_and_its_ancestors(tmp_path):
    _cgroup(tmp_path, "job.slice/step", "cpu.max", "max 100000\n")
    _cgroup(tmp_path, "job.slice", "cpu.max", "150000 100000\n")  # 1.5 CPUs for the slice
    assert threads.cgroup_quota(tmp_path, "0::/job.slice/step\n") == 1.5
    assert threads.cgroup_quota(tmp_path, "0::/elsewhere\n") is None
    _cgroup(tmp_path, "", "cpu.max", "max 100000\n")
    assert threads.cgroup_quota(tmp_path, "0::/\n") is None


def test_cgroup_v1_quota_over_period(tmp_path):
    _cgroup(tmp_path, "cpu,cpuacct/docker/abc", "cpu.cfs_quota_us", "300000\n")
    _cgroup(tmp_path, "cpu,cpuacct/docker/abc", "cpu.cfs_period_us", "100000\n")
    membership = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n"
    assert threads.cgroup_quota(tmp_path, membership) == 3.0
    _cgroup(tmp_path, "cpu,cpuacct/docker/abc", "cpu.cfs_quota_us", "-1\n")  # unlimited
    assert threads.cgroup_quota(tmp_path, membership) is None


def test_slurm_and_ranks_per_node_shrink_the_share():
    assert threads.cpu_share({"SLURM_CPUS_PER_TASK": "1"}).count == 1
    assert "SLURM_CPUS_PER_TASK 1" in threads.cpu_share({"SLURM_CPUS_PER_TASK": "1"}).source
    assert threads.cpu_share({"LOCAL_WORLD_SIZE": str(AFFINITY)}).count == 1
    assert threads.cpu_share({"LOCAL_WORLD_SIZE": str(4 * AFFINITY)}).count == 1  # never 0
    assert threads.cpu_share({"SLURM_CPUS_PER_TASK": "garbage"}).count == AFFINITY


def test_the_config_wins_then_omp_num_threads_then_the_share():
    env = {"OMP_NUM_THREADS": "3", "SLURM_CPUS_PER_TASK": "1"}
    assert threads.choose(5, env) == threads.Choice(5, "config threads")
    assert threads.choose(None, env) == threads.Choice(3, "OMP_NUM_THREADS")
    assert threads.choose(None, {"SLURM_CPUS_PER_TASK": "1"}).count == 1
    for bad in (0, -2, 1.5, True, "four"):
        with pytest.raises(BadInput, match="must be a positive whole number"):
            threads.choose(bad, env)


@pytest.mark.parametrize(
    ("env", "overrides", "expected", "source"),
    [
        ({"SLURM_CPUS_PER_TASK": "1"}, [], "1", "SLURM_CPUS_PER_TASK 1"),
        ({"SLURM_CPUS_PER_TASK": "1", "OMP_NUM_THREADS": "2"}, [], "2", "OMP_NUM_THREADS"),
        ({"OMP_NUM_THREADS": "2"}, ["threads=1"], "1", "config threads"),
    ],
)
def test_a_job_records_the_threads_it_ran_with(
    workdir, monkeypatch, env, overrides, expected, source
):
    for key in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = job_config(workdir, "budget.tokens=1024", "budget.eval_every_tokens=1024", *overrides)
    result = run(cfg)
    params = MlflowClient(tracking_uri=cfg.tracking.uri).get_run(result.run_id).data.params
    assert params["runtime.threads"] == expected
    assert source in params["runtime.threads_from"]


def test_a_thread_count_that_is_not_one_is_refused_before_anything_is_written(workdir):
    with pytest.raises(BadInput, match="threads=0 must be a positive whole number"):
        run(job_config(workdir, "threads=0"))
    assert not (workdir / "mlflow.db").exists()


def test_a_users_app_gets_the_same_count_and_its_run_records_it(workdir, monkeypatch):
    """Whatever our job gets, an app run by hyprun gets: in its subprocess's environment, and
    on its seed run."""
    from hyprun.runner.store.investigation import Store
    from tests.test_apps import ROOT, declare, run_cli

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/mlflow.db")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert threads.environment(1) == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    declare(workdir, run="subprocess")
    assert run_cli("baseline", "--seeds", "1", "--investigation", "apart") == 0
    store = Store(f"sqlite:///{workdir}/mlflow.db", "hyprun")
    seed_run = store.find("apart").baseline["seed_runs"][0]
    params = MlflowClient(tracking_uri=f"sqlite:///{workdir}/mlflow.db").get_run(seed_run)
    assert params.data.params["runtime.threads"] == "1"
    assert "SLURM_CPUS_PER_TASK 1" in params.data.params["runtime.threads_from"]


@pytest.mark.parametrize(("given", "kept"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_openmp_threads_wait_passively_unless_the_user_says_otherwise(given, kept):
    """A spinning OpenMP thread held the core its partner needed: 2 threads ran 4-25x slower
    than passive ones on a shared 2-core machine (bench/threads.py)."""
    assert after_importing_runner("OMP_WAIT_POLICY", given) == kept
