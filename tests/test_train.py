"""The training job on real DeepSpeed (CPU, gloo) and real MLflow (sqlite and a server)."""

from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

from hyprun.runner.errors import BadInput
from hyprun.runner.job.train import run
from tests.helpers import job_config, metric_history


def test_job_records_evidence_in_mlflow(workdir):
    cfg = job_config(workdir)
    result = run(cfg)
    assert result.status == "completed" and result.tokens == 4096
    uri = cfg.tracking.uri
    data = MlflowClient(tracking_uri=uri).get_run(result.run_id)
    assert data.info.status == "FINISHED"
    assert data.data.params["optim.lr"] == "0.001" and data.data.params["ds.zero_stage"] == "0"
    tags = data.data.tags
    assert tags["hyprun.outcome"] == "completed" and tags["hyprun.world_size"] == "1"
    assert tags["hyprun.device"] == "cpu" and tags["version.deepspeed"] != "absent"
    assert len(tags["hyprun.config_hash"]) == 16 and tags["hyprun.git_sha"]
    # The MLflow step of every metric is the number of tokens seen: 1024 tokens per step here.
    losses = metric_history(uri, result.run_id, "train/loss")
    assert [s for s, _ in losses] == [1024, 2048, 3072, 4096]
    assert [s for s, _ in metric_history(uri, result.run_id, "eval/loss")] == [2048, 4096]
    assert metric_history(uri, result.run_id, "eval/loss")[-1][1] == pytest.approx(result.eval_loss)
    assert all(v > 0 for _, v in metric_history(uri, result.run_id, "perf/tokens_per_s"))
    artifacts = [a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(result.run_id)]
    assert "config.yaml" in artifacts
    assert not (workdir / "ckpt").exists() or not any((workdir / "ckpt").iterdir())


@pytest.mark.slow  # a job long enough to learn
def test_loss_falls_on_the_synthetic_language(workdir):
    result = run(
        job_config(
            workdir, "budget.tokens=65536", "budget.eval_every_tokens=65536", "optim.lr=3e-3"
        )
    )
    assert result.eval_loss < 0.85 * math.log(256)


@pytest.mark.slow  # two or more jobs, or a job and a server
@pytest.mark.parametrize("stage", [1, 2])
def test_zero_stages_match_zero0(workdir, stage):
    """ZeRO shards optimizer state and gradients; in fp32 the arithmetic must be the same."""
    base = run(job_config(workdir, "tracking.experiment=z0"))
    zero = run(job_config(workdir, f"ds.zero_stage={stage}", f"tracking.experiment=z{stage}"))
    assert zero.train_loss == pytest.approx(base.train_loss, rel=1e-4)
    assert zero.eval_loss == pytest.approx(base.eval_loss, rel=1e-4)


def test_bf16_zero2_runs(workdir):
    result = run(job_config(workdir, "ds=zero2_bf16", "ds.micro_batch=16"))
    assert result.status == "completed" and math.isfinite(result.eval_loss)


@pytest.mark.slow  # two or more jobs, or a job and a server
def test_same_seed_same_losses_other_seed_differs(workdir):
    uri = f"sqlite:///{workdir}/mlflow.db"
    a = run(job_config(workdir, "tracking.experiment=a"))
    b = run(job_config(workdir, "tracking.experiment=b"))
    c = run(job_config(workdir, "tracking.experiment=c", "budget.seed=1"))
    history = [metric_history(uri, r.run_id, "train/loss") for r in (a, b, c)]
    assert history[0] == history[1]
    assert history[0] != history[2]


@pytest.mark.slow  # two or more jobs, or a job and a server
def test_gradient_accumulation_compares_at_matched_tokens(workdir):
    """A bigger batch through accumulation covers the same tokens in fewer steps."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    result = run(job_config(workdir, "ds.grad_accum=2"))
    assert result.steps == 2 and result.tokens == 4096
    assert [s for s, _ in metric_history(uri, result.run_id, "train/loss")] == [2048, 4096]


def test_divergence_ends_the_run_as_diverged(workdir):
    cfg = job_config(workdir, "optim.lr=1e6", "ds.grad_clip=0", "sched=constant")
    result = run(cfg)
    assert result.status == "diverged" and result.steps < 4
    data = MlflowClient(tracking_uri=cfg.tracking.uri).get_run(result.run_id)
    assert data.info.status == "FAILED" and data.data.tags["hyprun.outcome"] == "diverged"


def test_budget_smaller_than_one_step_is_refused(workdir):
    with pytest.raises(BadInput, match="less than one optimizer step"):
        run(job_config(workdir, "budget.tokens=100"))
    assert not (workdir / "mlflow.db").exists()


@pytest.mark.slow  # two or more jobs, or a job and a server
def test_job_against_a_tracking_server(workdir, mlflow_server):
    cfg = job_config(workdir, uri=mlflow_server)
    result = run(cfg)
    client = MlflowClient(tracking_uri=mlflow_server)
    data = client.get_run(result.run_id)
    assert data.info.status == "FINISHED"
    assert len(client.get_metric_history(result.run_id, "train/loss")) == 4
    assert "config.yaml" in [a.path for a in client.list_artifacts(result.run_id)]


@pytest.mark.slow  # a job beyond test_job_records_evidence_in_mlflow's
def test_sparser_logging_reports_the_window_mean(workdir):
    """With log_every_steps=2 each train/loss point is the mean of the two steps it covers."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    every = run(job_config(workdir, "tracking.experiment=every"))
    sparse = run(job_config(workdir, "tracking.experiment=sparse", "tracking.log_every_steps=2"))
    dense = [v for _, v in metric_history(uri, every.run_id, "train/loss")]
    points = metric_history(uri, sparse.run_id, "train/loss")
    assert [s for s, _ in points] == [2048, 4096]
    expected = [(dense[0] + dense[1]) / 2, (dense[2] + dense[3]) / 2]
    assert [v for _, v in points] == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow  # a job that waits for MLflow's system-metrics samples
def test_system_metrics_are_recorded_on_the_job_run(workdir):
    cfg = job_config(
        workdir, "tracking.system_metrics_every_s=0.2", "data.source.loader_delay_ms=300"
    )
    result = run(cfg)
    metrics = MlflowClient(cfg.tracking.uri).get_run(result.run_id).data.metrics
    assert metrics["system/cpu_utilization_percentage"] >= 0
    assert metrics["system/system_memory_usage_megabytes"] > 0


def test_tokens_are_counted_from_the_sequences_trained(workdir):
    """data.source.seq_len=8 on a seq_len-64 model: 16 x 8 = 128 tokens a step, not 1024 (the
    job once counted 8x the tokens it trained, stopped 8x early and put the MLflow step axis 8x
    off)."""
    cfg = job_config(workdir, "data.source.seq_len=8", "budget.eval_every_tokens=2048")
    result = run(cfg)
    assert result.status == "completed"
    assert (result.steps, result.tokens) == (32, 4096)
    steps = [s for s, _ in metric_history(cfg.tracking.uri, result.run_id, "train/loss")]
    assert steps == [128 * k for k in range(1, 33)]
    assert [s for s, _ in metric_history(cfg.tracking.uri, result.run_id, "eval/loss")] == [
        2048,
        4096,
    ]
    tags = MlflowClient(tracking_uri=cfg.tracking.uri).get_run(result.run_id).data.tags
    assert tags["hyprun.tokens"] == "4096" and tags["hyprun.steps"] == "32"


def test_sequences_longer_than_the_models_context_are_refused(workdir):
    with pytest.raises(BadInput, match=r"data\.source\.seq_len=128 .*model\.seq_len=64"):
        run(job_config(workdir, "data.source.seq_len=128"))
    assert not (workdir / "mlflow.db").exists()


def test_a_job_stopped_early_reports_the_loss_it_stopped_at(workdir):
    """Early rejection stops a job right after an evaluation: its result carries that loss
    (it read `n/a`), the one the last eval/loss point shows."""
    seen: list[float] = []

    def stop_at_first_eval(tokens: int, value: float) -> bool:
        seen.append(value)
        return True

    cfg = job_config(workdir)
    result = run(cfg, on_eval=stop_at_first_eval)
    assert result.status == "stopped"
    assert result.eval_loss == seen[-1]
    logged = metric_history(cfg.tracking.uri, result.run_id, "eval/loss")
    assert logged[-1][1] == pytest.approx(seen[-1])
