"""L1 probes inside real DeepSpeed jobs: exact gradient norms at every ZeRO stage, activation,
attention and parameter statistics, and the module that produced a NaN."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hydra.utils import instantiate

from hyprun.runner.job.data.loader import build_loader
from hyprun.runner.job.train import run
from tests.helpers import job_config, metric_history

SLOW = pytest.mark.slow  # stages 0 and 2 stay in the fast tier: they cover the sharded path


def reference_grad_norm(cfg) -> float:
    """clip_grad_norm_ of an unsharded plain-torch step on the job's first batch."""
    torch.manual_seed(cfg.budget.seed)
    model = instantiate(cfg.model)
    source = instantiate(cfg.data.source)
    loader = build_loader(
        source,
        seed=cfg.budget.data_seed,
        micro_batch=cfg.ds.micro_batch,
        grad_accum=cfg.ds.grad_accum,
        rank=0,
        world=1,
        start_step=0,
        total_steps=1,
    )
    for x, y in loader:
        (model(x, y) / cfg.ds.grad_accum).backward()
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e9))


@pytest.mark.parametrize("stage", [0, pytest.param(1, marks=SLOW), 2, pytest.param(3, marks=SLOW)])
def test_global_grad_norm_matches_unsharded_clip_grad_norm(workdir, stage):
    cfg = job_config(
        workdir,
        f"ds.zero_stage={stage}",
        "ds.grad_accum=2",
        "budget.tokens=8192",
        f"tracking.experiment=zero{stage}",
    )
    result = run(cfg)
    step, norm = metric_history(cfg.tracking.uri, result.run_id, "grad/norm")[0]
    assert step == 2048  # the first step is probed
    assert norm == pytest.approx(reference_grad_norm(cfg), rel=1e-5)
    # ZeRO-3 keeps a shard of each weight per rank: no full weights to move along the step.
    scanned = metric_history(cfg.tracking.uri, result.run_id, "step/loss_x8")
    assert (scanned == []) == (stage == 3)


def test_probes_report_every_statistic(workdir):
    cfg = job_config(workdir, "probes.every_steps=2", "model.n_experts=4", "model.top_k=1")
    result = run(cfg)
    uri, run_id = cfg.tracking.uri, result.run_id

    def last(key: str) -> float:
        history = metric_history(uri, run_id, key)
        assert history, f"{key} was not logged"
        return history[-1][1]

    assert [s for s, _ in metric_history(uri, run_id, "grad/norm")] == [1024, 3072]
    for block in ("blocks.0", "blocks.1"):
        assert last(f"grad/norm/{block}") > 0
        assert last(f"act/rms/{block}") > 0
        assert 0 < last(f"act/write_ratio/{block}") < 10
        assert 0 < last(f"attn/entropy/{block}") <= 1
        assert 1 <= last(f"moe/imbalance/{block}") <= 4
    assert last("grad/norm/tok_emb") > 0 and last("moe/aux_loss") > 0
    assert 0 < last("param/update_ratio") < 0.1
    assert 0 < last("param/dist_from_init") < 1
    assert last("param/norm") > 0 and last("param/embedding_rms") > 0
    assert 0 < last("perf/mfu") <= 1 and last("perf/peak_mem_gb") > 0
    assert last("anomaly/loss_spike") in (0.0, 1.0) and last("anomaly/spike_score") >= 0
    scan = {m: metric_history(uri, run_id, f"step/loss_x{m}") for m in (0, 1, 2, 4, 8)}
    assert all([s for s, _ in points] == [1024, 3072] for points in scan.values())
    assert all(math.isfinite(v) for points in scan.values() for _, v in points)


@pytest.mark.parametrize("ds", ["default", pytest.param("zero2_bf16", marks=SLOW)])
def test_the_step_scan_leaves_training_unchanged(workdir, ds):
    """The scan moves the weights along the step and puts them back: with it on or off the
    same seed trains to the same losses, bit for bit (bf16 weights and fp32 masters too)."""
    runs = []
    for scan in ("true", "false"):
        cfg = job_config(
            workdir,
            f"ds={ds}",
            "probes.every_steps=1",
            f"probes.step_scan={scan}",
            f"tracking.experiment=scan-{scan}",
            f"checkpoint.dir={workdir}/ckpt-{scan}",
        )
        result = run(cfg)
        runs.append(
            (result.eval_loss, metric_history(cfg.tracking.uri, result.run_id, "train/loss"))
        )
    assert runs[0] == runs[1]
    assert runs[0][0] is not None and len(runs[0][1]) >= 4


def test_probes_off_log_no_probe_metrics(workdir):
    cfg = job_config(workdir, "probes=off")
    result = run(cfg)
    assert metric_history(cfg.tracking.uri, result.run_id, "grad/norm") == []
    assert metric_history(cfg.tracking.uri, result.run_id, "train/loss")


def test_nan_is_traced_to_the_module_that_made_it(workdir):
    """A NaN planted in one block's MLP weights: the job ends as diverged and names that layer."""
    cfg = job_config(
        workdir,
        "model._target_=tests.faults.GPTWithNaN",
        "+model.nan_parameter=blocks.1.mlp.fc.weight",
    )
    result = run(cfg)
    assert result.status == "diverged" and result.steps == 1
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(tracking_uri=cfg.tracking.uri).get_run(result.run_id).data.tags
    assert tags["hyprun.outcome"] == "diverged"
    assert tags["hyprun.nan_module"] == "blocks.1.mlp.fc"
    assert tags["hyprun.nan_after_updates"] == "0"  # NaN on the initial weights
    assert math.isnan(metric_history(cfg.tracking.uri, result.run_id, "train/loss")[-1][1])


def test_a_nan_mid_step_is_caught_at_its_step_before_it_reaches_the_weights(workdir):
    """The NaN check runs once per optimizer step: a NaN in the 2nd micro-step of step 3 still
    ends the job at step 3, names its module, and no optimizer step applied it."""
    cfg = job_config(
        workdir,
        "ds.grad_accum=2",
        "ds.micro_batch=8",
        "model._target_=tests.faults.GPTWithNaNAt",
        "+model.nan_parameter=blocks.0.attn.proj.weight",
        "+model.at_forward=6",  # step 3 (1-based), its 2nd micro-step
    )
    result = run(cfg)
    assert result.status == "diverged" and result.steps == 3
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(tracking_uri=cfg.tracking.uri).get_run(result.run_id).data.tags
    assert tags["hyprun.nan_module"] == "blocks.0.attn.proj"
    assert tags["hyprun.nan_after_updates"] == "2"
    losses = metric_history(cfg.tracking.uri, result.run_id, "train/loss")
    tokens_per_step = 2 * 8 * cfg.model.seq_len
    assert losses[-1][0] == 3 * tokens_per_step and math.isnan(losses[-1][1])
    assert all(math.isfinite(value) for _, value in losses[:-1])


def test_cpu_peak_is_the_best_this_machine_has_shown(tmp_path):
    """A busy machine only lowers a matmul timing: the peak is the best measurement, kept per
    machine, and measuring it leaves the job's random stream alone."""
    from hyprun.runner.job.instrument import _cpu_key, cpu_peak

    cache = tmp_path / "cpu_peak.json"
    state = torch.get_rng_state()
    measured = cpu_peak(cache, refresh=True)
    assert torch.equal(state, torch.get_rng_state())
    assert measured > 1e8 and json.loads(cache.read_text()) == {_cpu_key(): measured}
    cache.write_text(json.dumps({_cpu_key(): measured * 100}))  # an idler moment, earlier
    assert cpu_peak(cache, refresh=True) == measured * 100


def test_an_mfu_above_one_remeasures_the_cpu_peak():
    """A peak measured while the machine was busy reads MFU > 1: measured again, not clamped."""
    from hyprun.runner.job.instrument import PeakFlops

    peak = PeakFlops(torch.device("cpu"), "fp32")
    peak.value = 1e6  # as if measured under heavy load
    metrics = peak.mfu(tokens_per_s=1000, flops_per_token=1e5, world=1)  # 1e8 FLOP/s achieved
    assert 0 < metrics["perf/mfu"] <= 1 and peak.value > 1e8


def test_an_mfu_above_one_is_never_logged_as_mfu(workdir):
    """A peak that cannot be right (here one given too low) is said, not logged as an MFU."""
    cfg = job_config(workdir, "probes.peak_flops=1.0")
    with pytest.warns(RuntimeWarning, match="MFU .* > 1"):
        result = run(cfg)
    assert metric_history(cfg.tracking.uri, result.run_id, "perf/mfu") == []
    above = metric_history(cfg.tracking.uri, result.run_id, "perf/mfu_above_peak")
    assert above and all(value > 1 for _, value in above)


def test_layer_profile_decomposes_a_step(workdir):
    from hyprun.runner.compose import compose
    from hyprun.runner.job.profile import profile_layers

    found = profile_layers(compose(["model.n_layer=3"]), steps=2, warmup=1)
    assert {"blocks.0", "blocks.1", "blocks.2", "lm_head"} <= found.keys()
    assert all(found[f"blocks.{i}"]["forward_ms"] > 0 for i in range(3))
    assert all(found[f"blocks.{i}"]["backward_ms"] > 0 for i in range(3))
    assert sum(row["share"] for row in found.values()) == pytest.approx(1.0)
