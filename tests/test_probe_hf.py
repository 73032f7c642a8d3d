"""The probe inside Hugging Face's Trainer: a tiny GPT-2 from a config (nothing downloaded)
trained a few steps with `HyprunTrainerCallback`, its L1 evidence read back from MLflow."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from mlflow.tracking import MlflowClient
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from hyprun.diag.live_checks import read_l0_tags
from hyprun.runner.cli.main import main as hyprun
from hyprun.runner.control.diagnose import diagnose
from hyprun.runner.job.callbacks import HyprunTrainerCallback
from tests.helpers import metric_history

pytestmark = pytest.mark.slow  # transformers' Trainer: its import and a few steps

BATCH, SEQ, VOCAB, STEPS = 4, 16, 96, 12


class Tokens(torch.utils.data.Dataset):
    """Sequences of a repeating pattern plus noise: learnable in a few steps."""

    def __init__(self, n: int = 64, seed: int = 0):
        rng = torch.Generator().manual_seed(seed)
        base = torch.arange(SEQ) % 7
        self.rows = (base + torch.randint(0, VOCAB, (n, 1), generator=rng)) % VOCAB

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    return GPT2LMHeadModel(config)


class OwnLoss(Trainer):
    """A Trainer subclass with its own loss, as users write one: the model is called without
    labels (its forward returns no loss) and the next-token loss is taken from the logits."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits[:, :-1].reshape(-1, outputs.logits.shape[-1])
        loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:].reshape(-1))
        return (loss, outputs) if return_outputs else loss


def train(
    tmp_path,
    model,
    callbacks,
    steps: int = STEPS,
    accumulation: int = 1,
    trainer=Trainer,
    dataset: torch.utils.data.Dataset | None = None,
) -> Trainer:
    args = TrainingArguments(
        gradient_accumulation_steps=accumulation,
        output_dir=str(tmp_path / "out"),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=3e-3,
        max_grad_norm=0.5,  # clipping on: the probe must measure before it and keep it
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
    )
    data = dataset if dataset is not None else Tokens()
    trainer = trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    trainer.train()
    return trainer


def exit_code(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_:
        hyprun(args)
    return exit_.value.code


@pytest.fixture
def mlflow_env(workdir, monkeypatch):
    """What hyprun's app adapter does: a run made beforehand, named in the environment."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("app")
    run_id = client.create_run(experiment).info.run_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    return uri, run_id


def test_trainer_callback_logs_the_jobs_l1_metrics(workdir, mlflow_env):
    uri, run_id = mlflow_env
    probed = train(workdir, tiny_gpt2(), [HyprunTrainerCallback(every_steps=4)])
    tokens_per_step = BATCH * SEQ
    steps = lambda key: [s for s, _ in metric_history(uri, run_id, key)]

    assert steps("train/loss") == [tokens_per_step * k for k in range(1, STEPS + 1)]
    probed_at = [tokens_per_step * (k + 1) for k in range(0, STEPS, 4)]  # steps 0, 4, 8
    for key in (
        "grad/norm",
        "grad/norm/blocks.0",
        "grad/norm/blocks.1",
        "grad/norm/wte",
        "param/update_ratio",
        "param/dist_from_init",
        "param/embedding_rms",
        "act/rms/blocks.0",
        "act/write_ratio/blocks.1",
    ):
        assert steps(key) == probed_at, key
    for key in ("perf/mfu", "perf/data_wait_frac", "perf/step_time_s", "anomaly/loss_spike"):
        assert len(steps(key)) == STEPS, key

    # The gradient norm is the Trainer's own, before clipping: it logged it at every step.
    theirs = [e["grad_norm"] for e in probed.state.log_history if "grad_norm" in e]
    ours = [v for _, v in metric_history(uri, run_id, "grad/norm")]
    assert ours == pytest.approx([theirs[k] for k in range(0, STEPS, 4)], rel=1e-4)
    assert max(theirs) > 0.5, "clipping must have had something to clip"
    # The per-block norms add up to the global norm (squares).
    blocks = [metric_history(uri, run_id, f"grad/norm/{m}")[0][1] for m in ("blocks.0", "blocks.1")]
    assert math.hypot(*blocks) < ours[0]

    # Clipping taken over, not dropped: training is the same as without the callback.
    plain = train(workdir, tiny_gpt2(), [])
    losses = lambda t: [e["loss"] for e in t.state.log_history if "loss" in e]
    assert losses(probed) == pytest.approx(losses(plain), rel=1e-5)
    assert probed.args.max_grad_norm == 0.5

    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    assert run.info.status == "RUNNING", "the adapter owns the run's status, not the probe"
    assert run.data.tags["hyprun.step_unit"] == "tokens"
    assert run.data.tags["hyprun.blocks"] == "transformer.h"


class SlowTokens(Tokens):
    """A dataset that takes 10 ms a row: 40 ms to fetch a batch of 4."""

    def __getitem__(self, i):
        time.sleep(0.01)
        return super().__getitem__(i)


class SlowLogger(TrainerCallback):
    """A user's logger that takes 40 ms each time the Trainer logs (every step here)."""

    def on_log(self, args, state, control, **kwargs):
        time.sleep(0.04)


@pytest.mark.parametrize(
    ("dataset", "callbacks", "waits"),
    [(SlowTokens(), [], True), (Tokens(), [SlowLogger()], False)],
    ids=["slow_fetch", "slow_logger"],
)
def test_data_wait_is_the_trainers_fetch_not_its_logging(
    workdir, mlflow_env, dataset, callbacks, waits
):
    """Between two steps the Trainer logs, evaluates and saves, then fetches: only the fetch is
    waiting for data (40 ms either way here; sleeps only grow under load)."""
    uri, run_id = mlflow_env
    train(workdir, tiny_gpt2(), [*callbacks, HyprunTrainerCallback(every_steps=0)], dataset=dataset)
    share = metric_history(uri, run_id, "perf/data_wait_frac")[1:]
    step = metric_history(uri, run_id, "perf/step_time_s")[1:]
    waited = sorted(w * s for (_, w), (_, s) in zip(share, step, strict=True))
    median = waited[len(waited) // 2]
    assert median >= 0.04 if waits else median < 0.02, waited


def test_the_training_loss_under_gradient_accumulation_is_the_trainers_own(workdir, mlflow_env):
    """Under accumulation the Trainer gives each forward num_items_in_batch, and each returns its
    share of the step's token mean: the probe sums the shares (their mean read the training loss
    4x too low at 4 accumulation steps)."""
    uri, run_id = mlflow_env
    callback = HyprunTrainerCallback(every_steps=4)
    trainer = train(workdir, tiny_gpt2(), [callback], steps=4, accumulation=4)
    theirs = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    ours = [v for _, v in metric_history(uri, run_id, "train/loss")]
    assert len(ours) == len(theirs) == 4
    assert ours == pytest.approx(theirs, rel=2e-3)  # the Trainer rounds what it logs


@pytest.mark.parametrize("accumulation", [1, 2])
def test_a_trainers_own_compute_loss_is_the_loss_the_probe_reads(workdir, mlflow_env, accumulation):
    """A subclass's compute_loss that calls the model without labels: the forward returns no
    loss, so the probe reads what compute_loss returned (a micro-batch mean, not a share)."""
    uri, run_id = mlflow_env
    callback = HyprunTrainerCallback(every_steps=4)
    trainer = train(workdir, tiny_gpt2(), [callback], 4, accumulation, trainer=OwnLoss)
    theirs = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    ours = [v for _, v in metric_history(uri, run_id, "train/loss")]
    assert ours == pytest.approx(theirs, rel=2e-3) and len(ours) == 4
    assert "compute_loss" not in vars(trainer)  # the Trainer as the user made it, after


class Padded(Tokens):
    """Tokens cut to a drawn length and padded (attention mask 0), with labels -100 at padding
    as a collator sets them, or `labels = input_ids` as many a fine-tuning script wrote it."""

    def __init__(self, padding_is_a_target: bool):
        super().__init__()
        lengths = torch.randint(
            4, SEQ, (len(self.rows), 1), generator=torch.Generator().manual_seed(1)
        )
        self.mask = (torch.arange(SEQ) < lengths).long()
        self.rows = self.rows.masked_fill(self.mask == 0, 0)
        self.labels = (
            self.rows if padding_is_a_target else self.rows.masked_fill(self.mask == 0, -100)
        )

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


@pytest.mark.parametrize(("padding_is_a_target", "status"), [(False, "pass"), (True, "fail")])
def test_labels_at_masked_padding_are_padding_in_the_loss(
    workdir, mlflow_env, padding_is_a_target, status
):
    """labels = input_ids with the padding left in (OpenJarvis PR 521, DeepSpeedExamples PR
    819): the loss trains on predicting padding wherever the attention mask is 0."""
    uri, run_id = mlflow_env
    data = Padded(padding_is_a_target)
    train(workdir, tiny_gpt2(), [HyprunTrainerCallback(every_steps=4)], 4, dataset=data)
    tags = MlflowClient(uri).get_run(run_id).data.tags
    checks = {c["id"]: c for c in read_l0_tags(tags)}
    assert checks["loss_on_padding"]["status"] == status, checks["loss_on_padding"]
    assert checks["labels_misaligned"]["status"] == "pass"


@pytest.mark.parametrize(
    ("trainer", "accumulation", "status"),
    [(Trainer, 2, "pass"), (OwnLoss, 2, "fail"), (OwnLoss, 1, "skip")],
)
def test_a_compute_loss_that_ignores_num_items_in_batch_is_an_unscaled_accumulated_loss(
    workdir, mlflow_env, trainer, accumulation, status
):
    """The Trainer divides by the accumulation steps only when it believes the loss did not
    use num_items_in_batch; a subclass's compute_loss that ignores it, on a model whose forward
    takes loss kwargs, trains on the sum of micro-batch means (transformers #47688, trl #5710).
    The shipped Trainer keeps the scale; one micro-batch per step is not judged."""
    uri, run_id = mlflow_env
    train(workdir, tiny_gpt2(), [HyprunTrainerCallback(every_steps=4)], 4, accumulation, trainer)
    tags = MlflowClient(uri).get_run(run_id).data.tags
    checks = {c["id"]: c for c in read_l0_tags(tags)}
    assert checks["accumulation_loss_scale"]["status"] == status, checks["accumulation_loss_scale"]
    assert checks["labels_misaligned"]["status"] == "pass"  # the model shifts labels=input_ids
    assert checks["clip_ineffective"]["status"] == "skip"  # the Trainer clips in its own step
    assert checks["repeated_batch"]["status"] == "pass"  # a new batch each step
    assert checks["tied_head_untied"]["status"] == "pass"  # GPT-2's head is its embedding
    assert checks["modules_not_registered"]["status"] == "pass"
    assert checks["scheduler_stepped_before_optimizer"]["status"] == "pass"  # its own LambdaLR
    assert checks["logits_nonnegative"]["status"] == "pass"
    # each micro-batch adds to the last one's gradients; one micro-batch has nothing to add to
    kept = "pass" if accumulation > 1 else "skip"
    assert checks["accumulation_grads_discarded"]["status"] == kept
    if status == "fail":
        assert "tokens weigh 2 " in checks["accumulation_loss_scale"]["why"]


def test_diagnose_judges_what_a_probe_recorded_and_names_what_it_did_not(
    workdir, mlflow_env, capsys
):
    uri, run_id = mlflow_env
    train(workdir, tiny_gpt2(), [HyprunTrainerCallback(every_steps=2)])
    assert exit_code(["diagnose", "--run", run_id, "--uri", uri]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "L0 checks of the optimizer and model as the probe read them" in out
    assert "Not judged: evidence this run lacks" in out

    assert exit_code(["diagnose", "--run", run_id, "--uri", uri, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    measured = document["features"]
    for name in ("grad_norm_median", "update_ratio_median", "write_ratio_max", "mfu", "lr"):
        assert name in measured, name
    # Nothing fired on a number the run does not have; what could not be judged says why.
    for finding in document["findings"]:
        assert set(finding["numbers"]) <= set(measured), finding["id"]
    skipped = {row["id"]: row for row in document["not_judged"]}
    assert skipped, "a probe run lacks evidence some rows need"
    for row in skipped.values():
        assert row["missing"] and not set(row["missing"]) & {
            k for k, f in measured.items() if f["value"] is not None
        }, row
    assert "eval/loss and train/loss" in document["missing_evidence"]
    assert not any(need.startswith("grad/norm ") for need in document["missing_evidence"])
    # L0 from the live optimizer: the Trainer's AdamW, its LR and clipping, read at step 0.
    static = {c["id"]: c for c in document["static"]}
    assert static["lr_plausible"]["value"] == pytest.approx(3e-3)
    # judged as AdamW, not as Accelerate's wrapper around it (a band, a warmup, betas)
    for check in ("lr_plausible", "warmup", "adam_betas", "weight_decay"):
        assert static[check]["status"] != "skip", static[check]
    assert static["grad_clip"]["value"] == 0.5 and static["optimizer_coverage"]["value"] == 0
    why = document["why_unmeasured"]
    scan = next(k for k in why if k.startswith("step/loss_x"))  # no eval set: no scan batch
    assert why[scan].startswith("step scan off: no held-out batch"), why
    assert "no attention probabilities" in why[next(k for k in why if k.startswith("attn/"))]


def test_trainer_callback_names_the_module_of_a_planted_nan(workdir, monkeypatch):
    uri = f"sqlite:///{workdir}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    model = tiny_gpt2()
    callback = HyprunTrainerCallback(every_steps=4, step_unit="steps")

    class Poison(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 3:
                with torch.no_grad():
                    model.transformer.h[1].mlp.c_fc.weight[0, 0] = float("inf")

    trainer = train(workdir, model, [Poison(), callback])
    assert trainer.state.global_step == 4, "training stops at the first NaN loss"
    probe = callback.probe
    assert probe.diverged and probe.nan_module == "transformer.h.1.mlp.c_fc"
    run = MlflowClient(tracking_uri=uri).get_run(probe.run_id)
    assert run.data.tags["hyprun.nan_module"] == "transformer.h.1.mlp.c_fc"
    assert run.data.tags["hyprun.nan_after_updates"] == "3"
    assert run.data.tags["hyprun.outcome"] == "diverged"
    assert run.info.status == "FAILED", "a run the probe made is ended by the probe"
    losses = metric_history(uri, probe.run_id, "train/loss")
    assert [s for s, _ in losses] == [1, 2, 3, 4]  # step_unit=steps
    assert math.isnan(losses[-1][1]) and all(math.isfinite(v) for _, v in losses[:-1])

    _, document = diagnose(uri, probe.run_id, "hyprun")
    top = document["findings"][0]
    assert top["id"] == "nan_in_module" and "transformer.h.1.mlp.c_fc" in top["evidence"]


def test_a_requeued_trainer_resumes_from_its_last_complete_checkpoint(tmp_path):
    """A job preempted while saving leaves a newer `checkpoint-N` holding only some files (seen
    on Slurm: config.json, generation_config.json): `get_last_checkpoint` returns it and the
    Trainer refuses it; the last complete one resumes."""
    from transformers.trainer_utils import get_last_checkpoint

    from hyprun.runner.job.callbacks import last_complete_checkpoint

    out = tmp_path / "out"

    def trainer(steps: int) -> Trainer:
        args = TrainingArguments(
            output_dir=str(out),
            max_steps=steps,
            save_steps=2,
            per_device_train_batch_size=BATCH,
            report_to="none",
            use_cpu=True,
            seed=0,
        )
        return Trainer(model=tiny_gpt2(), args=args, train_dataset=Tokens())

    trainer(4).train()
    cut_short = out / "checkpoint-6"
    cut_short.mkdir()
    tiny_gpt2().config.save_pretrained(cut_short)  # what a killed save had written
    assert get_last_checkpoint(str(out)) == str(cut_short)
    with pytest.raises(ValueError, match="valid checkpoint"):
        trainer(6).train(resume_from_checkpoint=get_last_checkpoint(str(out)))

    assert last_complete_checkpoint(out) == str(out / "checkpoint-4")
    assert last_complete_checkpoint(tmp_path / "nothing") is None
    resumed = trainer(6)
    resumed.train(resume_from_checkpoint=last_complete_checkpoint(out))
    assert resumed.state.global_step == 6


def test_trainer_callback_ends_training_at_the_step_a_stop_is_asked(tmp_path, mlflow_env):
    """Early rejection's contract (runner/job/stop.py), without timing: a stop asked during step 3
    ends the Trainer at that step's end, not at its budget."""
    from transformers import TrainerCallback

    from hyprun.runner.job import stop

    class AskAtStep3(TrainerCallback):  # as hyprun's watch thread asks, from outside the loop
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 2:
                stop.request()

    with stop.listening():
        trainer = train(tmp_path, tiny_gpt2(), [AskAtStep3(), HyprunTrainerCallback()])
    assert trainer.state.global_step == 3 < STEPS
