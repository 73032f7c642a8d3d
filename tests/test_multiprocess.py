"""Two processes under torchrun (gloo on CPU) train ZeRO-2 like one process with the same batch."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from runner.train import run
from tests.helpers import free_port, job_config, metric_history, python_env


def test_zero2_two_processes_match_one(workdir):
    uri = f"sqlite:///{workdir}/mlflow.db"
    common = ["budget.tokens=8192", "budget.eval_every_tokens=4096", "budget.eval_sequences=32",
              f"tracking.uri={uri}", f"checkpoint.dir={workdir}/ckpt"]  # fmt: skip
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(free_port()), "-m", "runner.train"]  # fmt: skip
    done = subprocess.run(
        [*torchrun, *common, "ds.zero_stage=2", "ds.micro_batch=8", "tracking.experiment=two"],
        cwd=workdir, env=python_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr

    client = MlflowClient(tracking_uri=uri)
    (two,) = client.search_runs([client.get_experiment_by_name("two").experiment_id])
    assert two.data.tags["hyprun.world_size"] == "2"  # and only rank 0 created a run

    # One process with micro batch 16 sees exactly the rows both ranks saw together.
    one = run(job_config(workdir, "budget.tokens=8192", "budget.eval_every_tokens=4096",
                         "ds.zero_stage=2", "tracking.experiment=one"))  # fmt: skip
    loss_two = metric_history(uri, two.info.run_id, "train/loss")
    loss_one = metric_history(uri, one.run_id, "train/loss")
    assert [s for s, _ in loss_two] == [s for s, _ in loss_one]
    assert [v for _, v in loss_two] == pytest.approx([v for _, v in loss_one], rel=1e-4)
    eval_two = metric_history(uri, two.info.run_id, "eval/loss")[-1][1]
    assert eval_two == pytest.approx(one.eval_loss, rel=1e-4)
