"""Two processes (gloo on CPU) train ZeRO-2 exactly like one process with the same global batch,
under both launchers users have: torchrun and the deepspeed launcher."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from hyprun.runner.job.train import run
from tests.helpers import free_port, job_config, metric_history, python_env

pytestmark = pytest.mark.slow  # two-process DeepSpeed jobs under two launchers

BUDGET = ["budget.tokens=8192", "budget.eval_every_tokens=4096", "ds.zero_stage=2"]
LAUNCHERS = {
    "torchrun": ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"],
    "deepspeed": ["-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port"],
}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_zero2_two_processes_match_one(workdir, launcher):
    uri = f"sqlite:///{workdir}/mlflow.db"
    module = (
        ["--module", "hyprun.runner.job.train"]
        if launcher == "deepspeed"
        else ["-m", "hyprun.runner.job.train"]
    )
    command = [
        sys.executable,
        *LAUNCHERS[launcher],
        str(free_port()),
        *module,
        *BUDGET,
        "budget.eval_sequences=32",
        "ds.micro_batch=8",
        f"tracking.uri={uri}",
        f"checkpoint.dir={workdir}/ckpt",
        "tracking.experiment=two",
    ]
    done = subprocess.run(
        command, cwd=workdir, env=python_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr

    client = MlflowClient(tracking_uri=uri)
    (two,) = client.search_runs([client.get_experiment_by_name("two").experiment_id])
    assert two.data.tags["hyprun.world_size"] == "2"  # and only rank 0 created a run

    # One process with micro batch 16 sees exactly the rows both ranks saw together.
    one = run(job_config(workdir, *BUDGET, "tracking.experiment=one"))
    loss_two = metric_history(uri, two.info.run_id, "train/loss")
    loss_one = metric_history(uri, one.run_id, "train/loss")
    assert [s for s, _ in loss_two] == [s for s, _ in loss_one]
    assert [v for _, v in loss_two] == pytest.approx([v for _, v in loss_one], rel=1e-4)
    eval_two = metric_history(uri, two.info.run_id, "eval/loss")[-1][1]
    assert eval_two == pytest.approx(one.eval_loss, rel=1e-4)
    # The global gradient norm of the sharded pair equals the single process's (first step).
    norm_two = metric_history(uri, two.info.run_id, "grad/norm")[0]
    norm_one = metric_history(uri, one.run_id, "grad/norm")[0]
    assert norm_two[0] == norm_one[0] and norm_two[1] == pytest.approx(norm_one[1], rel=1e-5)
