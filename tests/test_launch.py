"""Launcher choice and its guards (no cluster needed; tests/e2e/test_slurm.py runs the jobs)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from hyprun.runner.control.context import where_tests_run
from hyprun.runner.errors import BadInput
from hyprun.runner.job import dist
from hyprun.runner.launch.launchers import (
    InProcess,
    Slurm,
    launcher_for,
    launcher_params,
    safe_name,
    split,
)
from hyprun.runner.store.investigation import State


def test_launcher_overrides_are_split_from_the_job_and_compose_hydra_submitit_configs(tmp_path):
    job, launcher = split(
        ["optim.lr=1e-3", "hydra/launcher=slurm_8xa100", "hydra.launcher.partition=a100"]
    )
    assert job == ["optim.lr=1e-3"]
    params = launcher_params(launcher)
    assert (params["tasks_per_node"], params["gpus_per_node"], params["nodes"]) == (8, 8, 1)
    assert params["partition"] == "a100" and params["additional_parameters"] == {"requeue": True}
    assert params["signal_delay_s"] == 120 and params["max_num_timeout"] > 0
    assert launcher_params(["hydra/launcher=slurm_cpu"])["tasks_per_node"] == 1
    assert isinstance(launcher_for([], tmp_path, "x"), InProcess)
    assert isinstance(launcher_for(launcher, tmp_path, "x"), Slurm)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["hydra.launcher.partition=gpu"], "needs a launcher"),
        (["hydra/launcher=submitit_local"], "Slurm only"),
        (["hydra/launcher=slurm_cpu", "hydra.launcher.qos='a\nb'"], "line break"),
        (["hydra/launcher=nope"], "no config"),
    ],
)
def test_bad_launcher_overrides_are_refused(overrides, message, tmp_path):
    with pytest.raises(BadInput, match=message):
        launcher_for(overrides, tmp_path, "x")


def test_tests_run_on_the_baselines_hardware():
    state = State("inv", "run", {"launcher": ["hydra/launcher=slurm_cpu"]})
    assert isinstance(where_tests_run(state, ["hydra.launcher.partition=other"], "H1"), Slurm)
    for given in (["hydra/launcher=slurm_8xa100"], ["hydra.launcher.gpus_per_node=4"]):
        with pytest.raises(BadInput, match="other hardware"):
            where_tests_run(state, given, "H1")
    local = State("inv", "run", {"launcher": []})
    with pytest.raises(BadInput, match="other hardware"):
        where_tests_run(local, ["hydra/launcher=slurm_cpu"], "H1")


def test_job_names_cannot_break_out_of_their_sbatch_line():
    assert safe_name("a$(touch x);\n#SBATCH --wrap='id'") == "a-touch-x-SBATCH---wrap-id"
    assert safe_name("\n;$") == "hyprun"


def test_a_slurm_task_ignores_the_rendezvous_its_submitter_exported(monkeypatch):
    """sbatch exports the submitter's environment: a task must not reuse a MASTER_PORT that the
    submitting process (which ran a job in-process) still listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        submitter = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        for key, value in {**submitter, "MASTER_PORT": port}.items():  # restored afterwards
            monkeypatch.setenv(key, value)
        for key, value in dict(
            SLURM_PROCID="0",
            SLURM_NTASKS="1",
            SLURM_LOCALID="0",
            SLURM_JOB_ID="155",
            SLURM_JOB_NODELIST="vm",
        ).items():
            monkeypatch.setenv(key, value)
        dist.forget_submitter()
        dist.prepare_env()
        assert os.environ["MASTER_PORT"] == "20155" != port
        assert os.environ["MASTER_ADDR"] == "vm"


def test_a_build_lock_left_by_a_killed_process_does_not_hang_the_next_job(monkeypatch):
    """torch waits forever on an extension's build lock; a process killed holding it leaves one."""
    for key in ("RANK", "WORLD_SIZE", "MASTER_PORT", "TORCH_EXTENSIONS_DIR", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    join = [sys.executable, "-c", "from hyprun.runner.job import dist; print(dist.init().world)"]
    subprocess.run(join, check=True, timeout=600)  # builds the extension once per venv (~40 s)
    leftover = dist.extensions_dir() / "deepspeed_shm_comm" / "lock"
    leftover.touch()
    done = subprocess.run(join, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split()[-1] == "1", done.stderr[-2000:]
    assert not leftover.exists()
