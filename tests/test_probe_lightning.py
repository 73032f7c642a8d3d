"""The probe inside Lightning: a small residual language model as a LightningModule, trained a few
steps by `lightning.Trainer` with `HyprunLightningCallback`, its L1 evidence read from MLflow."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import mlflow
import pytest
import torch
from lightning.pytorch.callbacks import EMAWeightAveraging, WeightAveraging
from mlflow.tracking import MlflowClient
from torch import nn

from hyprun.diag.live_checks import read_l0_tags
from hyprun.runner.job.callbacks import HyprunLightningCallback
from tests.helpers import metric_history

pytestmark = pytest.mark.slow  # lightning's Trainer: its import and a few steps

BATCH, SEQ, VOCAB, WIDTH, STEPS = 4, 16, 64, 32, 8


class Block(nn.Module):
    """A pre-norm residual MLP block: the stream in, the stream out."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class TinyLM(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(WIDTH, VOCAB)
        self.grad_norms: list[float] = []

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

    def loss(self, ids):
        logits = self(ids[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch))

    def on_before_optimizer_step(self, optimizer):
        # The reference: the norm of all gradients before Lightning clips them.
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.grad_norms.append(float(torch.nn.utils.get_total_norm(grads)))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def loader(seed: int):
    rng = torch.Generator().manual_seed(seed)
    rows = (torch.arange(SEQ + 1) * 3 + torch.randint(0, VOCAB, (64, 1), generator=rng)) % VOCAB
    return torch.utils.data.DataLoader(rows, batch_size=BATCH)


def fit(module, callbacks, steps=STEPS, **options):
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=0.5,
        val_check_interval=4,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        **options,
    )
    trainer.fit(module, loader(0), loader(1))
    return trainer


def test_lightning_callback_logs_the_jobs_l1_metrics(workdir, monkeypatch):
    uri = f"sqlite:///{workdir}/mlflow.db"
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    torch.manual_seed(0)
    module = TinyLM()
    with mlflow.start_run() as active:  # the user's own run: the probe logs into it
        fit(module, [HyprunLightningCallback(every_steps=2)])
    run_id = active.info.run_id
    tokens_per_step = BATCH * (SEQ + 1)
    steps = lambda key: [s for s, _ in metric_history(uri, run_id, key)]

    assert steps("train/loss") == [tokens_per_step * k for k in range(1, STEPS + 1)]
    probed_at = [tokens_per_step * (k + 1) for k in range(0, STEPS, 2)]
    for key in (
        "grad/norm",
        "grad/norm/blocks.0",
        "grad/norm/embed",
        "param/update_ratio",
        "param/embedding_rms",
        "act/rms/blocks.1",
        "act/write_ratio/blocks.0",
    ):
        assert steps(key) == probed_at, key
    for key in ("perf/data_wait_frac", "perf/step_time_s", "perf/mfu", "train/lr"):
        assert len(steps(key)) == STEPS, key
    assert steps("eval/loss") == [tokens_per_step * 4, tokens_per_step * 8]

    ours = [v for _, v in metric_history(uri, run_id, "grad/norm")]
    assert ours == pytest.approx(module.grad_norms[::2], rel=1e-5), "the norm before clipping"
    assert max(module.grad_norms) > 0.5, "clipping must have had something to clip"
    tags = MlflowClient(tracking_uri=uri).get_run(run_id).data.tags
    assert tags["hyprun.blocks"] == "layers" and tags["hyprun.outcome"] == "completed"


def test_lightning_callback_names_the_module_of_a_planted_nan(workdir, monkeypatch):
    uri = f"sqlite:///{workdir}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)

    class Poison(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 3:
                with torch.no_grad():
                    module.layers[1].mlp[2].weight[0, 0] = float("inf")

    torch.manual_seed(0)
    callback = HyprunLightningCallback(every_steps=2)
    trainer = fit(TinyLM(), [Poison(), callback])
    assert trainer.global_step < STEPS, "training stops at the first NaN loss"
    probe = callback.probe
    assert probe.diverged and probe.nan_module == "layers.1.mlp.2"
    run = MlflowClient(tracking_uri=uri).get_run(probe.run_id)
    assert run.data.tags["hyprun.nan_module"] == "layers.1.mlp.2"
    assert run.data.tags["hyprun.nan_after_updates"] == "3"  # a NaN after three updates
    assert run.info.status == "FAILED"
    losses = metric_history(uri, probe.run_id, "train/loss")
    assert math.isnan(losses[-1][1]) and all(math.isfinite(v) for _, v in losses[:-1])


def test_lightning_callback_ends_training_at_the_step_a_stop_is_asked(workdir, monkeypatch):
    """Early rejection's contract (runner/job/stop.py), without timing: a stop asked during step 3
    ends the fit at that step's end, not at its budget."""
    from hyprun.runner.job import stop

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/mlflow.db")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)

    class AskAtStep3(pl.Callback):  # as hyprun's watch thread asks, from outside the loop
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.global_step == 2:
                stop.request()

    with stop.listening():
        trainer = fit(TinyLM(), [AskAtStep3(), HyprunLightningCallback()])
    assert trainer.global_step == 3 < STEPS


@pytest.mark.parametrize(("accumulation", "status"), [(1, "skip"), (2, "pass")])
def test_lightnings_accumulation_keeps_the_losss_scale(workdir, monkeypatch, accumulation, status):
    """Lightning divides each micro-batch's loss by accumulate_grad_batches: the step's tokens
    weigh 1 in total, and the targets (the ids one on) read as next-token prediction."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/mlflow.db")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    torch.manual_seed(0)
    callback = HyprunLightningCallback(every_steps=2)
    fit(TinyLM(), [callback], steps=4, accumulate_grad_batches=accumulation)
    tags = MlflowClient(tracking_uri=f"sqlite:///{workdir}/mlflow.db").get_run(
        callback.probe.run_id
    )
    checks = {c["id"]: c for c in read_l0_tags(tags.data.tags)}
    assert checks["accumulation_loss_scale"]["status"] == status, checks["accumulation_loss_scale"]
    assert checks["accumulation_grads_discarded"]["status"] == status  # each adds to the last
    assert checks["labels_misaligned"]["status"] == "pass"
    assert checks["clip_ineffective"]["status"] == "skip"  # Lightning clips in its own step
    assert checks["repeated_batch"]["status"] == "pass"  # a new batch each step
    # the val loader's batch through training_step: repeatable, and causal although the
    # module feeds itself tokens[:, :-1]
    assert checks["functional_dropout_in_eval"]["status"] == "pass"
    assert checks["causal_mask_missing"]["status"] == "pass"
    # the invariants of what trains hold on Lightning's own loop: no module run without a
    # gradient, no weight written outside its step, a backward before each step, no freeze
    # written on a module, no module run outside the model
    held = ("sublayer_output_discarded", "weights_overwritten", "steps_without_backward")
    for check in (*held, "freeze_set_on_module", "modules_not_registered", "logits_nonnegative"):
        assert checks[check]["status"] == "pass", checks[check]


def _moved_away(averaged, current, num_averaged):
    """An EMA update with its sign flipped (ostris/ai-toolkit#1034): the gap added, not taken."""
    for average, weight in zip(averaged, current, strict=True):
        average.add_((average - weight) * 0.1)


@pytest.mark.parametrize(
    ("averaging", "status"),
    [
        (lambda: EMAWeightAveraging(decay=0.9), "pass"),
        (lambda: WeightAveraging(multi_avg_fn=_moved_away), "fail"),
    ],
    ids=["ema", "sign_flipped"],
)
def test_lightnings_weight_averaging_is_held_to_an_ema(workdir, monkeypatch, averaging, status):
    """Lightning's own EMA callback (an AveragedModel it keeps beside the module) is found by the
    probe and reads as an average of the weights, updated once per step; the same callback given
    an update with its sign flipped fails."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/mlflow.db")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    torch.manual_seed(0)
    callback = HyprunLightningCallback(every_steps=2)
    fit(TinyLM(), [averaging(), callback])
    tags = MlflowClient(tracking_uri=f"sqlite:///{workdir}/mlflow.db").get_run(
        callback.probe.run_id
    )
    checks = {c["id"]: c for c in read_l0_tags(tags.data.tags)}
    assert checks["ema_update_wrong"]["status"] == status, checks["ema_update_wrong"]
    assert checks["ema_updated_per_micro_batch"]["status"] == "pass"
