"""Ready callbacks: the probe (runner/job/probe.py) for Hugging Face `Trainer` and Lightning.

    from hyprun.runner.job.callbacks import HyprunTrainerCallback
    Trainer(model, args, train_dataset=data, callbacks=[HyprunTrainerCallback()])

    from hyprun.runner.job.callbacks import HyprunLightningCallback
    lightning.Trainer(callbacks=[HyprunLightningCallback()]).fit(module, loader)

`last_complete_checkpoint(output_dir)` is the Trainer checkpoint to resume from after a requeue.

Keyword arguments go to `Probe` (`every_steps`, `step_unit`, `flops_per_token`, ...). The metrics
land in the MLflow run named by MLFLOW_RUN_ID (what `hyprun baseline --app` sets), else the active
run, else a new one; step = tokens seen (or optimizer steps, `step_unit="steps"`).

Neither library is a dependency of hyprun: each class is built on first use, when its library is
imported (a module `__getattr__`), so importing this module costs nothing.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import torch

from hyprun.runner.job.probe import Probe, keeps_grads

EVAL_LOSS_KEYS = ("eval/loss", "val_loss", "val/loss", "eval_loss", "validation_loss")
"""Names under which a Lightning module logs its held-out loss, first found wins."""


@cache
def _trainer_callback() -> type:
    from transformers import TrainerCallback

    class HyprunTrainerCallback(TrainerCallback):
        """L1 probes inside `transformers.Trainer`.

        Gradients are measured before clipping, as in the built-in job: the Trainer clips
        before any callback runs, so this callback clips instead (same `max_grad_norm`, same
        `clip_grad_norm_`) right after measuring; the training is unchanged. Under DeepSpeed,
        whose engine clips inside its step, the Trainer's clipping is left alone."""

        def __init__(self, **probe_options: Any):
            self.options = probe_options
            self.probe: Probe | None = None
            self.max_grad_norm = 0.0

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            clip = float(args.max_grad_norm or 0.0)
            if clip > 0 and not args.deepspeed:
                self.max_grad_norm, args.max_grad_norm = clip, 0.0
            optimizer = kwargs.get("optimizer")  # read for the LR; stepped by the Trainer
            options = {"grad_clip": clip, "total_steps": state.max_steps or None}
            options["epoch_steps"] = _epoch_steps(
                kwargs.get("train_dataloader"), args.gradient_accumulation_steps
            )
            pad_id = getattr(getattr(model, "config", None), "pad_token_id", None)
            options["pad_id"] = pad_id if isinstance(pad_id, int) else None  # some configs: a list
            options |= self.options
            trainer = _calling_trainer()
            loader = kwargs.get("eval_dataloader")  # set once an evaluation ran
            if trainer is not None and trainer.eval_dataset and loader is None:
                loader = trainer.get_eval_dataloader()  # as the Trainer builds it for eval
            if "heldout" not in options and loader is not None:
                rows = args.per_device_train_batch_size
                options["heldout"] = lambda: first_rows(next(iter(loader)), rows)
            self.probe = Probe(model, optimizer, hook_optimizer=False, **options)
            if trainer is not None:
                _read_trained_loss(trainer, self.probe)

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            self.probe.after_backward()
            if self.max_grad_norm and not self.probe.diverged:
                import torch

                torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_grad_norm)

        def on_optimizer_step(self, args, state, control, **kwargs):
            self.probe.after_step()

        # The wait for data is what lies between the Trainer's step bookkeeping (scheduler,
        # zero_grad: before on_step_end) and its fetch (before on_step_begin), less any
        # evaluation, checkpoint or logging in between. Counted from the optimizer step to the
        # forward, the Trainer's own ~1 ms between ~9 ms CPU steps read as a 10% data wait.
        def on_step_begin(self, args, state, control, **kwargs):
            if self.probe is not None:
                self.probe.data_ready()

        def on_step_end(self, args, state, control, **kwargs):
            self._not_waiting()
            if self.probe.diverged or self.probe.should_stop:  # should_stop: stop.py
                control.should_training_stop = True

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            if self.probe is not None and metrics and "eval_loss" in metrics:
                self.probe.log_eval(metrics["eval_loss"])
            self._not_waiting()

        def on_save(self, args, state, control, **kwargs):
            self._not_waiting()

        def on_log(self, args, state, control, **kwargs):
            self._not_waiting()

        def _not_waiting(self) -> None:
            if self.probe is not None:
                self.probe.not_waiting()

        def on_train_end(self, args, state, control, **kwargs):
            if self.max_grad_norm:
                args.max_grad_norm = self.max_grad_norm  # the args as the user made them
            trainer = _calling_trainer()
            if trainer is not None and "compute_loss" in vars(trainer):
                del trainer.compute_loss  # the Trainer's own method again
            if self.probe is not None:
                self.probe.close()

    return _by_reference(HyprunTrainerCallback)


@cache
def _lightning_callback() -> type:
    from lightning.pytorch import Callback

    class HyprunLightningCallback(Callback):
        """L1 probes inside `lightning.Trainer` (automatic optimisation). Lightning calls
        `on_before_optimizer_step` before it clips, so gradients are measured before clipping."""

        def __init__(self, **probe_options: Any):
            self.options = probe_options
            self.probe: Probe | None = None
            self.steps_seen = 0

        def on_fit_start(self, trainer, pl_module):
            optimizer = trainer.optimizers[0] if trainer.optimizers else None
            # Lightning hands the batch and the loss to callbacks, and steps the optimizer
            # itself: the probe does not hook the forward or the optimizer here.
            options = {"grad_clip": float(trainer.gradient_clip_val or 0.0), **self.options}
            options.setdefault("total_steps", trainer.max_steps if trainer.max_steps > 0 else None)
            if "heldout" not in options:
                options["heldout"] = _val_batch(trainer)
                options.setdefault("loss_fn", _training_step_loss)
            self.probe = Probe(pl_module, None, watch_forward=False, **options)
            self.probe.optimizer = optimizer
            # Known only now: whether the gradients stay in .grad between micro-batches.
            self.probe.invariants.read_accumulation = keeps_grads(optimizer)
            self.steps_seen = trainer.global_step

        def on_train_start(self, trainer, pl_module):
            if self.probe is not None and self.probe.epoch_steps is None:  # batches now known
                batches = trainer.num_training_batches
                if batches != float("inf"):
                    self.probe.epoch_steps = _epoch_steps(
                        range(int(batches)), trainer.accumulate_grad_batches
                    )

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.probe.batch_start(batch)

            def replay():  # the forward of this batch again, to find where a NaN came from
                return pl_module.training_step(batch, batch_idx)

            self.probe._replay = replay

        def on_before_backward(self, trainer, pl_module, loss):
            self.probe.note_loss(loss)

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.probe.after_backward()
            if self.probe.diverged:
                trainer.should_stop = True

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step > self.steps_seen:  # an optimizer step happened
                self.steps_seen = trainer.global_step
                self.probe.after_step()
                trainer.should_stop = trainer.should_stop or self.probe.should_stop  # stop.py

        def on_validation_epoch_end(self, trainer, pl_module):
            if trainer.sanity_checking or self.probe is None:
                return
            metrics = trainer.callback_metrics
            key = next((k for k in EVAL_LOSS_KEYS if k in metrics), None)
            if key is not None:
                self.probe.log_eval(float(metrics[key]))

        def on_validation_end(self, trainer, pl_module):
            # Validation between steps is not waiting for data. A checkpoint Lightning saves
            # after it (ModelCheckpoint runs last) still counts.
            if self.probe is not None:
                self.probe.not_waiting()

        def on_fit_end(self, trainer, pl_module):
            if self.probe is not None:
                self.probe.close()

        def on_exception(self, trainer, pl_module, exception):
            if self.probe is not None:
                self.probe.close()

    return _by_reference(HyprunLightningCallback)


def _epoch_steps(loader: Any, accumulation: int) -> int | None:
    """Optimizer steps in one pass over a training loader (None: its length is unknown, e.g.
    an iterable dataset): what the probe's fair-stream invariant needs to know."""
    try:
        batches = len(loader)
    except TypeError:
        return None
    return max(batches // max(accumulation, 1), 1) if batches else None


def first_rows(batch: Any, rows: int) -> Any:
    """The first `rows` rows of every tensor in a batch: the step scan reads as many held-out
    sequences as one training micro-batch holds, so it costs five forwards of one."""
    if torch.is_tensor(batch):
        return batch[:rows] if batch.dim() else batch
    if isinstance(batch, Mapping):
        return {k: first_rows(v, rows) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(first_rows(v, rows) for v in batch)
    return batch


def _read_trained_loss(trainer, probe: Probe) -> None:
    """The probe reads the loss the Trainer trains on from its `compute_loss` (a subclass's
    own included: one that calls the model without labels leaves the forward no loss), scaled
    as the Trainer's `training_step` reads it: a share of the step's mean where the loss was
    normalised by `num_items_in_batch`, by the model or by `compute_loss_func`, else the
    micro-batch's mean. Evaluation calls it too: only training calls are read."""
    compute_loss = trainer.compute_loss

    def reading(model, inputs, *args, **kwargs):
        result = compute_loss(model, inputs, *args, **kwargs)
        if model.training and torch.is_grad_enabled():
            loss = result[0] if isinstance(result, tuple) else result
            probe.note_loss(loss.detach(), _share_of_step(trainer, kwargs))
        return result

    probe.losses_told = True
    trainer.compute_loss = reading


def _share_of_step(trainer, kwargs: dict) -> bool:
    """Whether the Trainer treats compute_loss's value as normalised over the accumulated
    step (transformers' own test in Trainer.training_step, attributes absent in older
    versions read as unset)."""
    told = getattr(trainer, "loss_is_scaled_for_ga", None)
    if told is not None:
        return bool(told)
    accepts = getattr(trainer, "model_accepts_loss_kwargs", False)
    return bool(
        (accepts and kwargs.get("num_items_in_batch") is not None)
        or getattr(trainer, "compute_loss_func", None) is not None
    )


def _calling_trainer():
    """The `transformers.Trainer` running this callback: the callback API hands callbacks no
    Trainer, and `on_train_begin` runs inside its training loop, so it is on the call stack.
    The eval set is there before the first evaluation builds `eval_dataloader`."""
    from transformers import Trainer

    frame = inspect.currentframe()
    while frame is not None:
        found = frame.f_locals.get("self")
        if isinstance(found, Trainer):
            return found
        frame = frame.f_back
    return None


def _val_batch(trainer) -> Callable[[], Any]:
    """The step scan's batch, fetched at the first probe (Lightning sets up its validation
    loader after `on_fit_start`): the first batch of `trainer.val_dataloaders`, cut to one
    training micro-batch's rows, on the module's device."""

    def heldout():
        loaders = trainer.val_dataloaders
        if not loaders:
            raise ValueError("the module validates on no dataloader (pass heldout=)")
        loader = loaders[0] if isinstance(loaders, list | tuple) else loaders
        batch = next(iter(loader))
        rows = getattr(trainer.train_dataloader, "batch_size", None)
        return trainer.strategy.batch_to_device(first_rows(batch, rows) if rows else batch)

    return heldout


def _training_step_loss(module, batch) -> Any:
    """The module's own loss on a held-out batch: its `training_step`, with `self.log` silenced
    (it would record the scan's losses as training metrics). The probe calls it in eval mode
    without autograd; a `training_step` that returns a dict gives its `"loss"`."""
    module.log = _no_log  # an instance attribute shadows LightningModule.log for this call
    try:
        return module.training_step(batch, 0)
    finally:
        del module.log


def _no_log(*args: Any, **kwargs: Any) -> None:
    return None


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest `checkpoint-N` folder a `Trainer` finished writing, to resume from after a
    requeue (None: start afresh). A job preempted while saving leaves a newer folder without
    `trainer_state.json` (the Trainer writes it last), which `get_last_checkpoint` would return
    and `Trainer.train` would refuse."""
    steps = {}
    for folder in Path(output_dir).glob("checkpoint-*"):
        found = re.fullmatch(r"checkpoint-(\d+)", folder.name)
        if found and (folder / "trainer_state.json").is_file():
            steps[int(found.group(1))] = folder
    return str(steps[max(steps)]) if steps else None


def _by_reference(cls: type) -> type:
    """Name the class as this module's attribute, so it pickles by reference."""
    cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return cls


BUILDERS = {
    "HyprunTrainerCallback": _trainer_callback,
    "HyprunLightningCallback": _lightning_callback,
}


def __getattr__(name: str) -> type:
    if name in BUILDERS:
        return BUILDERS[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
