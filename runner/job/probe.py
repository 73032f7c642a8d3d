"""L1 evidence from a training loop hyprun did not write: the probe API.

Two lines in any PyTorch loop give the metrics the built-in job logs, under the same names, into
one MLflow run, so `hyprun diagnose` reads them the same way:

    probe = Probe(model, optimizer)              # attach (hooks; the run comes from MLflow's env)
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        probe.after_backward(loss)               # gradients before clipping, NaN check
        clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()                         # the probe's step hook runs after it
        optimizer.zero_grad()
    probe.close()                                # or let the interpreter's exit do it

The statistics are diag/'s (probes, spikes, efficiency), the same functions the job uses, so a
number means the same thing in both. With a torch optimizer the probe hooks its `step()`; with
anything else (a DeepSpeed engine) call `probe.after_step()` after the step. The MLflow step of
every metric is the number of tokens seen (counted from the integer input of each training
forward, times the world size), or the optimizer step with `step_unit="steps"`; the unit is
recorded in the tag `hyprun.step_unit`.

Where the time goes: seconds per step are measured between optimizer steps; the data-wait share
is the time between the end of one step and the first training forward of the next (fetching
the batch, moving it to the device), over the step time. Work a loop does there besides
fetching (evaluating, saving a checkpoint, its own logging) counts as waiting unless the loop
says it ended (`probe.not_waiting()`; a forward without gradients, an evaluation, says so by
itself); a trainer whose hook runs after its fetch ends the wait
there (`probe.data_ready()`, HF's step begin), so its own work before the forward is not counted.
"""

from __future__ import annotations

import atexit
import gc
import math
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from hyprun.diag import probes
from hyprun.diag.efficiency import mfu, transformer_flops_per_token
from hyprun.diag.evidence import NAN_MODULE_TAG, NAN_UPDATES_TAG, OUTCOME_TAG
from hyprun.diag.features import LR_MAX, SCAN_BATCH_LOSS, SCAN_TAG, VOCAB_TAG
from hyprun.diag.live_checks import LiveFacts, l0_tags, live_checks
from hyprun.diag.spikes import SpikeDetector
from hyprun.runner.job import model_checks, stop
from hyprun.runner.job.adam_step import first_moments, steps_beyond_bound
from hyprun.runner.job.averages import AverageReader
from hyprun.runner.job.dropout_calls import dropout_calls
from hyprun.runner.job.invariant_hooks import (
    InvariantHooks,
    in_own_forward,
    own_forwards,
    parameter_checksums,
    row_hashes,
)

STEP_UNITS = ("tokens", "steps")
SCHEDULER_READ_STEPS = 8
"""Optimizer steps after which a scheduler's count is held against the optimizer's."""
FROZEN_READS = 3
"""Probed steps at which the tensors with a zero gradient are read: a weight frozen by zeroing
its gradient reads zero at each; one zero at the first step only (LoRA's A beside a zero B)
does not."""
NO_HELDOUT = "no held-out batch was given (Probe(..., heldout=batch))"


class Probe:
    """The built-in job's L1 probes, attached to someone else's model and optimizer.

    every_steps: probe gradients, parameters and activations on the first step and every N
        after it (the job's `probes.every_steps`); loss, throughput and spikes every
        `log_every_steps`.
    step_unit: "tokens" (default, as the job) or "steps".
    tokens_per_step: tokens of one optimizer step over all processes, when the inputs do not
        say it (default: counted from the training forwards' integer inputs).
    flops_per_token: training FLOPs per token for MFU (default: the model's `flops_per_token()`,
        else the transformer formula from a Hugging Face config, else 6N).
    peak_flops: one device's peak FLOP/s (default: the device table; a CPU is measured).
    blocks: the residual blocks (default: found, see hyprun.diag.probes.find_blocks).
    watch_forward, hook_optimizer: whether the probe hooks the model's forward (tokens, loss,
        data wait) and the optimizer's step (`after_step`); trainer callbacks turn them off and
        report those events themselves.
    max_overhead, free_probes: after the first `free_probes` probes, a due probe is taken only
        while the probes' own time is under `max_overhead` of the run's (0: no cap); see
        hyprun.diag.probes.ProbeSchedule. A long run pays ~2% at the default interval (1.5%
        timed, plus the untimed hooks and logging).
    heldout: the step scan's fixed held-out batch, or a callable returning it (called once, at
        the first probed step): on probed steps the held-out loss is read with the step just
        taken scaled 0/1/2/4/8x (`step/loss_x<multiple>`, as the job). None: no step scan.
    loss_fn: `loss_fn(model, batch)` -> the loss of a batch; default: the model's own output
        (`model(**batch).loss` for a dict batch, Hugging Face style; `model(*batch)` for a
        tuple; a scalar tensor, `.loss` or `["loss"]` of what it returns).
    grad_clip: the clipping threshold the loop applies (0: none), for the L0 clipping check;
        None: judged from what the first step shows (trainer callbacks pass their trainer's).
    total_steps: the run's optimizer steps, when known (trainer callbacks pass max_steps): the
        LR schedule collapse check needs it; None: that check is skipped.
    epoch_steps: optimizer steps in one pass over the training data, when known: the
        fair-stream check compares the training loss with the step scan's held-out loss within
        the first epoch (it needs `heldout`); None: that check is skipped.
    pad_id: the token id that pads a sequence, for a loop whose forward gets no attention mask:
        the padding check then reads the runs of it at a row's ends as padding (the first pad
        after the text may be a real end-of-text token, so it is not counted). An attention
        mask, when the forward gets one, is read instead. None: only a mask is read.
    tracker: where to log (default: hyprun.runner.store.tracking.open_app_run, on rank 0 only).

    At its first two optimizer steps the probe also reads what the optimizer and model say
    (LR and schedule, weight decay, clipping, parameters missing from the optimizer or
    without a gradient) and records the L0 checks of hyprun.diag.live_checks on the run (tag
    `hyprun.l0_checks`), which `hyprun diagnose` reads as it reads the job's. Hooks keep
    reading the invariants of hyprun.diag.invariants over the run (runner/job/invariant_hooks.py:
    gradients reset between steps, dropout/batch-norm modes, the LR against `total_steps`,
    replicas after the first step, cross-entropy given logits at the first steps, the training
    loss against the held-out one in the first epoch), and the checks are recorded again at
    `close()`.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        every_steps: int = 16,
        log_every_steps: int = 1,
        step_unit: str = "tokens",
        tokens_per_step: int | None = None,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        blocks: nn.ModuleList | None = None,
        gradients: bool = True,
        parameters: bool = True,
        activations: bool = True,
        spikes: bool = True,
        nan_check: bool = True,
        step_scan: bool = True,
        max_overhead: float = 0.015,
        free_probes: int = 256,
        heldout: Any = None,
        loss_fn: Callable[[nn.Module, Any], Any] | None = None,
        grad_clip: float | None = None,
        total_steps: int | None = None,
        epoch_steps: int | None = None,
        pad_id: int | None = None,
        watch_forward: bool = True,
        hook_optimizer: bool = True,
        tracker=None,
        experiment: str | None = None,
        run_name: str | None = None,
    ):
        if step_unit not in STEP_UNITS:
            raise ValueError(f"step_unit={step_unit!r} is unknown: use tokens or steps")
        if not 0 <= max_overhead < 1 or free_probes < 0:
            raise ValueError(
                f"max_overhead={max_overhead}, free_probes={free_probes}: need "
                "0 <= max_overhead < 1 (a share of the run's time) and free_probes >= 0"
            )
        if pad_id is not None and (isinstance(pad_id, bool) or not isinstance(pad_id, int)):
            raise ValueError(f"pad_id={pad_id!r}: need the integer token id that pads, or None")
        if every_steps < 0 or log_every_steps < 1:
            raise ValueError(
                f"every_steps={every_steps}, log_every_steps={log_every_steps}: "
                "need every_steps >= 0 and log_every_steps >= 1"
            )
        self.model, self.optimizer = model, optimizer
        self.every_steps, self.log_every = every_steps, log_every_steps
        self.step_unit, self.tokens_per_step = step_unit, tokens_per_step
        self.switches = {
            "gradients": gradients,
            "parameters": parameters,
            "activations": activations,
            "spikes": spikes,
            "nan_check": nan_check,
            "step_scan": step_scan,
        }
        self.world, self.rank = _world()
        found = (None, blocks) if blocks is not None else probes.find_blocks(model)
        self.blocks_path, self.blocks = found if found else (None, None)
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._flops_given = flops_per_token
        self.flops_per_token, self.flops_source = 0.0, ""
        self._peak_flops = peak_flops
        self.loss_spikes, self.grad_spikes = SpikeDetector(), SpikeDetector()
        self.initial = self._params_on_cpu() if every_steps and parameters else None
        self.initial_norm = probes.grouped_norms(self.initial.items())[0] if self.initial else 0.0
        self._tracker, self._owned, self._given_tracker = tracker, False, tracker is not None
        self._experiment, self._run_name = experiment, run_name

        self.steps = 0
        """Optimizer steps done."""
        self.tokens = 0
        """Tokens seen (all processes)."""
        self.diverged = False
        """A loss was NaN/Inf: stop the loop (`if probe.diverged: break`)."""
        self.nan_module: str | None = None
        """The first module whose output went non-finite, by its name in the model."""

        self._step_tokens = 0
        self._backwards = 0
        self._micro_losses: list[torch.Tensor] = []
        self._checked = 0  # micro losses already tested for NaN/Inf
        self._window_losses: list[float] = []
        self._window_steps, self._window_wait = 0, 0.0
        self._window_start: float | None = None
        self._window_tokens_start = 0
        self._seq_len = 0
        self._last_end: float | None = None
        self._step_started = False
        self._last_inputs: tuple[tuple, dict] | None = None
        self._normalised_over_step = False
        self.losses_told = False
        """Set by a loop that tells the probe each micro-batch's loss (`note_loss`) from its own
        loss function: what the model's forward returns is then not the loss trained on."""
        self._replay: Callable[[], Any] | None = None
        self._probed: dict[str, float] = {}
        self._before: dict[str, torch.Tensor] = {}
        self._before_lrs: list[float] = []
        self._activations: ExitStack | None = None
        self._block_stats: probes.BlockStats | None = None
        self._handles = []
        if watch_forward:
            self._handles.append(
                model.register_forward_pre_hook(self._before_forward, with_kwargs=True)
            )
            self._handles.append(model.register_forward_hook(self._after_forward))
        if hook_optimizer and isinstance(optimizer, torch.optim.Optimizer):
            self._handles.append(optimizer.register_step_post_hook(lambda *_: self.after_step()))
        self._heldout, self._heldout_ready, self.loss_fn = heldout, False, loss_fn
        self._scan = probes.StepScan()
        self._model_checked = False
        self._frozen_reads, self._frozen_moved = 0, set()
        self._first_dropout: dict[str, float] = {}
        self._schedulers: list[tuple[weakref.ref, int]] = []
        self._steps_at_schedulers = 0
        self.scan_off: str | None = None if heldout is not None else NO_HELDOUT
        """Why the step scan is off (None: on)."""
        self.facts: LiveFacts | None = None
        """What the optimizer and model said at the first steps (the L0 checks' input)."""
        self._grad_clip = grad_clip
        self.total_steps, self.epoch_steps = total_steps, epoch_steps
        self.invariants = InvariantHooks(model, self._reads_stale_grads)
        self.averages = AverageReader(model)
        """The run-long invariants' hooks (mode modules, gradients left over, LRs)."""
        self.invariants.pad_id = pad_id
        embedding = _input_embedding(model)
        self.invariants.padding_idx = getattr(embedding, "padding_idx", None)
        self.invariants.read_step_norms = hook_optimizer and isinstance(
            optimizer, torch.optim.Optimizer
        )
        self.invariants.read_accumulation = keeps_grads(optimizer)
        self.invariants.watch_weights(_one_device([p for _, p in self.named]))
        self.schedule = probes.ProbeSchedule(every_steps, max_overhead, free_probes)
        self._decided_step, self._probing = -1, False
        self._closed = False
        self._stop_seen = False
        stop.honour(self)  # hyprun's stop request ends the loop at a step boundary (stop.py)
        atexit.register(self.close)

    # ------------------------------------------------------------ the loop's calls

    @property
    def should_stop(self) -> bool:
        """hyprun asked this seed to stop (early rejection): end the loop after this step. A loop
        that steps on gets `StopRequested` from the next `after_step` (runner/job/stop.py)."""
        return stop.requested()

    @property
    def probing(self) -> bool:
        """Whether the step in progress is probed: the first, then every `every_steps`, within
        the overhead cap (hyprun.diag.probes.ProbeSchedule), decided once per step."""
        if self._decided_step != self.steps:
            self._decided_step, self._probing = self.steps, self.schedule.due(self.steps)
        return self._probing

    def batch_start(self, batch: Any = None, tokens: int | None = None) -> None:
        """A micro-batch is ready (for loops whose forward the probe does not see): marks the
        end of the data wait and counts its tokens (`tokens`, or the batch's integer ids)."""
        self._start_micro()
        self._step_tokens += tokens if tokens is not None else _count_tokens(batch)
        self._seq_len = _sequence_length(batch) or self._seq_len

    def after_backward(self, loss: torch.Tensor | float | None = None) -> None:
        """After a micro-batch's backward, before clipping: checks the loss and, on probed
        steps, measures the gradients (each call overwrites: the last micro-batch of a step
        sees the accumulated gradient, the one the step applies)."""
        start = time.perf_counter()
        self._backwards += 1
        self.invariants.loss_read_done()
        self.invariants.weights_in_use()
        self.averages.backward()
        if loss is not None:
            self.note_loss(loss)
        self._close_activations()
        unchecked = self._micro_losses[self._checked :]
        self._checked = len(self._micro_losses)
        if self.switches["nan_check"] and unchecked and not _all_finite(unchecked):
            self._diverge()
            return
        if self.probing and self.switches["gradients"]:
            self._probed.update(self._gradients())
        if self.steps == 0:
            self._first_backward()
        if self.probing and self.switches["parameters"] and not self._before:
            self._before = {n: _full_param(p).detach().float().clone() for n, p in self.named}
            self._before_lrs = [float(g["lr"]) for g in getattr(self.optimizer, "param_groups", [])]
        if self.probing:
            self.schedule.spent(time.perf_counter() - start)

    def note_loss(self, loss: torch.Tensor | float, share_of_step: bool | None = None) -> None:
        """A micro-batch's loss, for loops whose forward does not return it to the probe.
        `share_of_step`: whether it is the micro-batch's share of the step's mean (normalised
        over the whole accumulated step, so the step's loss is their sum); None: as the forward
        said (num_items_in_batch given or not)."""
        self._micro_losses.append(_as_tensor(loss))
        if share_of_step is not None:
            self._normalised_over_step = share_of_step

    def after_step(self) -> None:
        """After the optimizer step (automatic for a torch optimizer): update ratio, tokens,
        throughput, spikes, and the metrics of this step into MLflow."""
        if self.diverged:
            return
        if self._stop_seen:  # the loop did not honour `should_stop` after the last step
            raise stop.StopRequested()
        self._stop_seen = stop.requested()
        now = time.perf_counter()
        if self.steps < 2:
            self._first_steps()
        metrics = dict(self._probed)
        probed = bool(self._probed or self._before)
        if self.facts is not None and (probed or self.steps == 0):
            self._read_dropout_rates()
        if self.facts is not None and self.steps == 1:  # an average is built before training
            self.averages.find()
        self.averages.step(probed)
        if self._before:
            metrics.update(self._parameters())
        self._probed, self._before = {}, {}
        trained = self._step_loss()
        if SCAN_BATCH_LOSS in metrics and trained is not None:  # the fair-stream invariant's read
            self.invariants.heldout_read(trained, metrics[SCAN_BATCH_LOSS])
        self.invariants.stepped(self.optimizer)
        if self.steps == 0 and self.facts is not None and self.world > 1:
            self.facts.replica_checksums = parameter_checksums([p for _, p in self.named])
        self.steps += 1
        self.tokens += self.tokens_per_step or self._step_tokens * self.world
        self._step_tokens, self._step_started = 0, False
        if trained is not None:
            self._window_losses.append(trained)
            self._micro_losses, self._checked = [], 0
        self._window_steps += 1
        if self.steps % self.log_every == 0:
            metrics.update(self._window(now))
        if metrics:
            self._log(metrics)
        self._last_end = time.perf_counter()  # the probe's own work is not waiting for data
        if probed:  # the probe's work on this step, its logging included, counts to the cap
            self.schedule.spent(self._last_end - now)

    def data_ready(self) -> None:
        """The step's data is in hand (a trainer's step-begin hook, called after its fetch):
        the data wait ends here, not at the first forward, so the trainer's own work between
        the two is not counted as waiting. The forward still counts the tokens."""
        self._start_micro()

    def not_waiting(self) -> None:
        """The loop's own work since the last step (an evaluation, a checkpoint, its logging)
        is not waiting for data: restart the wait clock. The trainer callbacks call this after
        each; a plain loop may too. Between steps only, so a step's own time is never cut."""
        if self._last_end is not None and not self._step_started:
            self._last_end = time.perf_counter()

    def log_eval(self, loss: float) -> None:
        """A held-out loss at the current step, as `eval/loss`."""
        self._log({"eval/loss": float(loss)})

    def close(self) -> None:
        """Deliver what is buffered; end the run only if the probe started it."""
        if self._closed:
            return
        unstepped = self.steps == 0 and self._backwards >= 2 and self.optimizer is not None
        if unstepped and self.facts is not None:
            self._open()  # a loop that never stepped logged nothing yet: its checks need a run
        self._closed = True
        stop.release(self)
        for handle in self._handles:
            handle.remove()
        self.invariants.remove()
        self._close_activations()
        if self.facts is not None and self.steps >= 1:  # the run-long invariants, as they ended
            self.facts.steps_taken = self._steps_taken()
            self._log_checks()
        elif self.facts is not None and unstepped:
            read_optimizer(self.facts, self.optimizer, self.named)
            self.facts.unstepped_backwards = self._backwards
            self._log_checks()
        if self._tracker is not None:
            status = "FAILED" if self.diverged else "FINISHED"
            self._tracker.set_tags(
                {
                    OUTCOME_TAG: "diverged" if self.diverged else "completed",
                    "hyprun.steps": self.steps,
                }
            )
            self._tracker.finish(status if self._owned else None)
        atexit.unregister(self.close)

    @property
    def run_id(self) -> str | None:
        """The MLflow run the probe logs into (rank 0; None on other ranks)."""
        tracker = self._open()
        return tracker.run_id if tracker else None

    def _step_loss(self) -> float | None:
        """The training loss of the step just taken, from its micro-batches' losses: their mean,
        or their sum where each forward was given num_items_in_batch (the HF Trainer under
        gradient accumulation: each returns its share of the step's token mean, and a mean
        would read the loss N times too low)."""
        if not self._micro_losses:
            return None
        micro = torch.stack([t.float() for t in self._micro_losses])
        return float(micro.sum() if self._normalised_over_step else micro.mean())

    # ------------------------------------------------------------ hooks

    def _before_forward(self, module, args, kwargs) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return
        self._start_micro()
        self._step_tokens += _count_tokens((args, kwargs))
        self._seq_len = _sequence_length((args, kwargs)) or self._seq_len
        self._last_inputs = (args, kwargs)
        self._normalised_over_step = kwargs.get("num_items_in_batch") is not None

    def _after_forward(self, module, args, output) -> None:
        if not torch.is_grad_enabled() and not in_own_forward():
            self.not_waiting()  # an evaluation between steps is the loop's work, not a fetch
        if self.losses_told or not (module.training and torch.is_grad_enabled()):
            return
        loss = _loss_of(output)
        if loss is not None:
            self._micro_losses.append(loss.detach())

    def _start_micro(self) -> None:
        """The first micro-batch of a step ends the data wait and opens the block probe."""
        if self._step_started:
            return
        self._step_started = True
        now = time.perf_counter()
        if self._window_start is None:
            self._window_start = now
        if self._last_end is not None:
            self._window_wait += now - self._last_end
        if self.probing and self.switches["activations"] and self.blocks is not None:
            self._activations = ExitStack()
            self._block_stats = self._activations.enter_context(
                probes.block_probe(self.model, self.blocks)
            )

    def _close_activations(self) -> None:
        if self._activations is None:
            return
        self._activations.close()
        stats, self._activations, self._block_stats = self._block_stats, None, None
        self._probed.update({f"act/rms/{k}": v for k, v in stats.rms.items()})
        self._probed.update({f"act/write_ratio/{k}": v for k, v in stats.write_ratio.items()})

    # ------------------------------------------------------------ measurements

    def _gradients(self) -> dict[str, float]:
        """Global and per-module gradient norms (before clipping), NaN/Inf, a spike flag."""
        grads = [
            (probes.canonical_name(n, self.blocks_path), g)
            for n, p in self.named
            if (g := _full_grad(p)) is not None
        ]
        total, per_group = probes.grouped_norms(grads)
        metrics = {"grad/norm": total, "grad/nonfinite": float(not math.isfinite(total))}
        metrics.update({f"grad/norm/{k}": v for k, v in per_group.items()})
        if self.switches["spikes"] and math.isfinite(total):
            metrics["anomaly/grad_spike"] = float(self.grad_spikes.update(total))
        return metrics

    def _parameters(self) -> dict[str, float]:
        """After a probed step: parameter norm, update/parameter ratio, distance from init,
        embedding RMS."""
        if not self._before:
            return {}
        names = [n for n, _ in self.named]
        now = [_full_param(p).detach().float() for _, p in self.named]
        device = now[0].device
        delta = torch._foreach_sub(now, [self._before[n] for n in names])
        moved = torch._foreach_sub(now, [self.initial[n].to(device) for n in names])
        norm, _ = probes.grouped_norms(zip(names, now, strict=True))
        step, _ = probes.grouped_norms(zip(names, delta, strict=True))
        drift, _ = probes.grouped_norms(zip(names, moved, strict=True))
        if self.facts is not None and self.facts.symmetric is None and self.steps >= 2:
            self.facts.symmetric = identical_rows(self.named)
        if self.facts is not None and self.facts.lost_updates is None and self._lr() > 0:
            self.facts.lost_updates = lost_updates(
                [self._before[n] for n in names], now, [p.grad for _, p in self.named]
            )
        if self.facts is not None and self.facts.eps_dominated is None and self.steps >= 2:
            self.facts.eps_dominated = eps_dominated(self.optimizer)
        if self.facts is not None:
            self._read_adam_step(now)
            self._read_gradient_cosine(names)
        if self.facts is not None and self._frozen_reads < FROZEN_READS:
            self._read_frozen_moved(names, now)
        metrics = {
            "param/norm": norm,
            "param/update_ratio": step / max(norm, 1e-12),
            "param/dist_from_init": drift / max(self.initial_norm, 1e-12),
        }
        embedding = _input_embedding(self.model)
        if embedding is not None:
            weight = _full_param(embedding.weight).detach().float()
            metrics["param/embedding_rms"] = float(weight.pow(2).mean().sqrt())
        if self.switches["step_scan"] and self.scan_off is None:
            metrics.update(self._step_scan(delta))
        return metrics

    def _read_adam_step(self, now: list[torch.Tensor]) -> None:
        """The probed step's largest Adam step over its bound (runner/job/adam_step.py), kept
        where it is the largest read so far."""
        read = steps_beyond_bound(
            unwrapped(self.optimizer), self.named, self._before, now, self._before_lrs
        )
        kept = self.facts.adam_step_excess
        if read is not None and (kept is None or read[0] > kept[0]):
            self.facts.adam_step_excess = (*read, self.steps)

    def _read_gradient_cosine(self, names: list[str]) -> None:
        """The probed step's cosine between the gradient it used and the weights it began from."""
        grads = [p.grad for _, p in self.named]
        cosine = gradient_weight_cosine([self._before[n] for n in names], grads)
        if cosine is not None:
            self.facts.grad_weight_cosines.append(cosine)

    def _read_dropout_rates(self) -> None:
        """The model's dropout rates at the first step, then at each probed step in train mode:
        those that changed since (invariants.dropout_changed), each named once."""
        rates = dropout_rates(self.model)
        if self.steps == 0:
            self._first_dropout = rates
            self.facts.dropout_changed = [] if rates else None
            return
        if not self.model.training or self.facts.dropout_changed is None:
            return
        named = {change.partition(": ")[0] for change in self.facts.dropout_changed}
        self.facts.dropout_changed += [
            f"{name}: {was:g} at the first step, {rates[name]:g} when read at step {self.steps + 1}"
            for name, was in self._first_dropout.items()
            if name in rates and rates[name] != was and name not in named
        ]

    def _read_frozen_moved(self, names: list[str], now: list[torch.Tensor]) -> None:
        """The tensors whose gradient was zero at every probed step read so far, yet which that
        step moved (invariants.frozen_yet_moved), once two steps are read."""
        grads = [p.grad for _, p in self.named]
        moved = set(zero_grad_moved(names, [self._before[n] for n in names], now, grads))
        self._frozen_moved = moved if self._frozen_reads == 0 else self._frozen_moved & moved
        self._frozen_reads += 1
        if self._frozen_reads >= 2:
            self.facts.frozen_moved = sorted(self._frozen_moved)

    def _step_scan(self, delta: list[torch.Tensor]) -> dict[str, float]:
        """The held-out loss along the step just taken (hyprun.diag.probes.StepScan), as the
        job reads it. A batch or loss the probe cannot use turns the scan off, with the reason
        recorded: the probe never stops the user's training."""
        params = [p for _, p in self.named]
        if any(hasattr(p, "ds_tensor") for p in params):
            return self._scan_stops("ZeRO-3 holds a shard of each weight per rank")
        try:
            batch = self._heldout_batch()
            data = [p.data for p in params]
            # the model checks read the model before the step: at the first, as initialised
            checks = None if self._model_checked else lambda: self._model_checks(batch)
            with own_forwards():  # not the loop's evaluation
                scanned = self._scan(self.model, data, delta, lambda: self._loss(batch), checks)
        except Exception as error:  # whatever the user's forward raises on this batch
            return self._scan_stops(f"the held-out forward failed: {type(error).__name__}: {error}")
        return scanned

    def _model_checks(self, batch: Any) -> None:
        """Once, on the held-out batch, with the weights before the first scanned step (the
        model as initialised): is evaluation repeatable, does the model read only
        earlier tokens, does a residual stream run through its blocks, is each linear layer
        fed something nonlinear (runner/job/model_checks.py), does each dropout call feed the
        loss once (runner/job/dropout_calls.py), is each of a block's twin modules called
        (model_checks.sibling_calls), does the loss read the logits as the model returns them
        (model_checks.loss_logit_scale), which parameters are read cut from the graph
        (model_checks.detached_reads)? A forward these checks cannot
        run leaves them unread (skipped), never the user's training stopped."""
        self._model_checked = True
        try:
            with own_forwards():
                self._read_model_checks(batch)
        except Exception as error:  # the checks' own forwards: a batch they cannot change
            warnings.warn(f"hyprun probe: model checks skipped: {error}", RuntimeWarning, 3)

    def _read_model_checks(self, batch: Any) -> None:
        hooks, loss = self.invariants, lambda: self._loss(batch)
        hooks.eval_gap = model_checks.repeat_gap(self.model, loss)
        hooks.future_influence = model_checks.future_influence(self.model, batch, self._loss)
        hooks.stream_pairs, hooks.linear_chains = model_checks.structure(self.model, loss)
        hooks.train_eval_scale = model_checks.train_eval_scale(self.model, loss)
        hooks.heldout_labels = model_checks.heldout_label_offsets(self.model, loss)
        hooks.row_influence = model_checks.row_influence(self.model, batch, self._loss)
        hooks.index_influence = model_checks.index_influence(self.model, batch, self._loss)
        hooks.attention = model_checks.attention(self.model, loss)
        hooks.stream_zeros = model_checks.stream_zeros(self.model, loss)
        hooks.dropout_calls = dropout_calls(self.model, loss)
        hooks.twin_calls = model_checks.sibling_calls(self.model, loss)
        hooks.loss_logit_scale = model_checks.loss_logit_scale(self.model, loss)
        hooks.detached_reads = model_checks.detached_reads(self.model, loss)
        hooks.padding_influence = model_checks.padding_influence(
            self.model, batch, self._loss, _input_embedding(self.model), hooks.pad_id
        )

    def _scan_stops(self, reason: str) -> dict[str, float]:
        self.scan_off = reason
        warnings.warn(f"hyprun probe: step scan off: {reason}", RuntimeWarning, stacklevel=3)
        if tracker := self._open():
            tracker.set_tags({SCAN_TAG: f"off: {reason}"})
        return {}

    def _heldout_batch(self) -> Any:
        """The fixed held-out batch on the model's device (a callable is called once)."""
        if not self._heldout_ready:
            found = self._heldout() if callable(self._heldout) else self._heldout
            self._heldout, self._heldout_ready = _to_device(found, self._device()), True
            ids = model_checks.input_ids(found)
            if ids is not None and ids.dim() == 2:  # its rows, to meet them in training
                self.invariants.heldout_rows = set(row_hashes(ids))
                self.invariants.heldout_ids = ids.detach().cpu()
        return self._heldout

    def _loss(self, batch: Any) -> torch.Tensor:
        if self.loss_fn is not None:
            loss = self.loss_fn(self.model, batch)
        else:
            loss = _loss_of(_forward(self.model, batch))
        if loss is None:
            raise ValueError("the model returned no scalar loss on it: pass loss_fn=")
        return loss

    # ------------------------------------------------------------ L0 from the live run

    def _first_backward(self) -> None:
        """After the first backward: which trainable parameters got no gradient, and the
        gradient norm before any clipping."""
        if self.facts is not None:
            return
        self.facts = LiveFacts()
        unreached = [(n, p) for n, p in self.named if _full_grad(p) is None]
        self.facts.no_grad = [n for n, _ in unreached]
        called = self.invariants.called_modules()
        self.facts.output_unused = [n for n in self.facts.no_grad if n.rpartition(".")[0] in called]
        trainable = sum(_elements(p) for _, p in self.named)
        self.facts.no_grad_share = sum(_elements(p) for _, p in unreached) / max(trainable, 1)
        self.facts.first_grad_norm = self._grad_norm()
        reached = trainable - sum(_elements(p) for _, p in unreached)
        if self.facts.first_grad_norm is not None and reached:
            self.facts.grad_rms = self.facts.first_grad_norm / math.sqrt(reached)
        self.facts.weight_rms = _weight_rms([p for _, p in self.named])
        schedulers = schedulers_of(self.optimizer) if self.optimizer is not None else []
        self.facts.early_scheduler_steps = schedulers_stepped_early(self.optimizer, schedulers)
        # each scheduler with its count now, to hold its later steps against the optimizer's
        self._schedulers = [(weakref.ref(s), getattr(s, "_step_count", 1)) for s in schedulers]
        self.invariants.watch_schedulers(schedulers)
        self._steps_at_schedulers = self.steps

    def _first_steps(self) -> None:
        """At the first optimizer step: the optimizer's settings and whether the gradient was
        clipped; at the second: whether the LR rose (a warmup); then the checks are logged."""
        if self.facts is None:
            return
        if self.steps == 1:
            groups = getattr(self.optimizer, "param_groups", None) or []
            self.facts.second_lr = float(groups[0]["lr"]) if groups else None
            self._log_checks()
            return
        read_optimizer(self.facts, self.optimizer, self.named)
        read_model(self.facts, self.model)
        self.facts.adam_moments = first_moments(unwrapped(self.optimizer))
        self.facts.shared_blocks = shared_blocks(self.blocks_path, self.blocks)
        self.facts.freeze_ignored = freeze_ignored(self.model)
        self.facts.untied_heads = untied_heads(self.model)
        self.facts.grad_clip = self._grad_clip
        self.facts.tokens_per_step = self.tokens_per_step or self._step_tokens * self.world
        if any(_uses_deepspeed(p) for _, p in self.named):
            return  # the engine clips inside its step, and frees the gradient after it
        before, now = self.facts.first_grad_norm, self._grad_norm()
        if before is not None and now is not None and now < before * (1 - 1e-4):
            self.facts.clipped_to = now

    def _grad_norm(self) -> float | None:
        grads = [(n, g) for n, p in self.named if (g := _full_grad(p)) is not None]
        return probes.grouped_norms(grads)[0] if grads else None

    def _reads_stale_grads(self, step: int) -> bool:
        """Whether step `step`'s first backward reads the gradients left over: the first three
        steps and every `every_steps` (a fixed rule: a pass over the .grads that exist)."""
        if any(_uses_deepspeed(p) for _, p in self.named[:1]):
            return False  # the engine owns and resets its gradients
        return step < 3 or bool(self.every_steps and step % self.every_steps == 0)

    def _log_checks(self) -> None:
        if self.facts is None or not self.facts.optimizer:
            return  # no optimizer the probe can read: no L0 check
        read_invariants(self.facts, self.invariants, self.total_steps, self.epoch_steps)
        self.facts.scheduler_lead = self._scheduler_lead()
        self.facts.averages = self.averages.reads()
        self.facts.unregistered = self.invariants.foreign_untrained(self.optimizer)
        checks = [asdict(c) for c in live_checks(self.facts)]
        if tracker := self._open():
            tracker.set_tags(l0_tags(checks))

    def _steps_taken(self) -> tuple[int, int] | None:
        """At close: (the optimizer steps the loop took, the steps it declared); None where the
        run's length is unknown, it diverged, or hyprun asked it to stop (stop.py)."""
        if not self.total_steps or self.diverged or stop.requested():
            return None
        return self.steps, self.total_steps

    def _scheduler_lead(self) -> tuple[int, int] | None:
        """(the most steps one of the optimizer's LR schedulers took since the first backward,
        the optimizer's steps since); None: no scheduler, or too few steps to judge."""
        taken = [
            getattr(scheduler, "_step_count", start) - start
            for ref, start in self._schedulers
            if (scheduler := ref()) is not None
        ]
        steps = self.steps - self._steps_at_schedulers
        return (max(taken), steps) if taken and steps >= SCHEDULER_READ_STEPS else None

    def _window(self, now: float) -> dict[str, float]:
        """Loss and throughput over the steps since the last log, as the job logs them."""
        metrics: dict[str, float] = {}
        if self._window_losses:
            loss = sum(self._window_losses) / len(self._window_losses)
            metrics["train/loss"] = _mean_over_ranks(loss, self.world)
            if self.switches["spikes"] and math.isfinite(loss):
                metrics["anomaly/loss_spike"] = float(self.loss_spikes.update(loss))
                metrics["anomaly/spike_score"] = self.loss_spikes.score
        if groups := getattr(self.optimizer, "param_groups", None):
            metrics["train/lr"] = self._lr()
            highest = max(float(group["lr"]) for group in groups)
            if highest != metrics["train/lr"]:  # per-group LRs (a layer-wise decay)
                metrics[LR_MAX] = highest
        start = self._last_window_start(now)
        elapsed = now - start
        if elapsed > 0 and self._window_steps:
            tokens_per_s = self._window_tokens / elapsed
            metrics["perf/step_time_s"] = elapsed / self._window_steps
            metrics["perf/data_wait_frac"] = min(self._window_wait / elapsed, 1.0)
            if tokens_per_s > 0:
                metrics["perf/tokens_per_s"] = tokens_per_s
                metrics.update(self._efficiency(tokens_per_s))
        self._window_losses, self._window_steps, self._window_wait = [], 0, 0.0
        self._window_start, self._window_tokens_start = None, self.tokens
        return metrics

    @property
    def _window_tokens(self) -> int:
        return self.tokens - self._window_tokens_start

    def _last_window_start(self, now: float) -> float:
        if self._last_end is not None and self._window_start is not None:
            return min(self._last_end, self._window_start)
        return self._window_start if self._window_start is not None else now

    def _efficiency(self, tokens_per_s: float) -> dict[str, float]:
        """MFU against the device peak (all processes together), and peak memory."""
        from hyprun.runner.job.instrument import _device_peak, _peak_memory_gb

        device = self._device()
        if not self.flops_per_token:  # known once a batch showed the sequence length
            self.flops_per_token, self.flops_source = _flops_per_token(
                self.model, self._flops_given, self._seq_len
            )
            if tracker := self._open():
                tracker.set_tags(
                    {"hyprun.flops_per_token": f"{self.flops_per_token:.6g} ({self.flops_source})"}
                )
        metrics = {"perf/flops_per_s": tokens_per_s * self.flops_per_token}
        if self._peak_flops is None:
            with torch.random.fork_rng(devices=[]):  # the CPU peak's matmuls draw random inputs:
                peak = _device_peak(device, _precision(self.model))  # keep the user's RNG as is
            self._peak_flops = peak or 0.0
        if self._peak_flops:
            metrics["perf/mfu"] = mfu(
                tokens_per_s, self.flops_per_token, self._peak_flops * self.world
            )
        metrics["perf/peak_mem_gb"] = _peak_memory_gb(device)
        return metrics

    def _diverge(self) -> None:
        """A non-finite loss: name the first module that produced one, record it, stop. Once:
        a loop that steps on after it (it need not read `diverged`) keeps the first NaN's
        record, not the last one's."""
        if self.diverged:
            return
        self.diverged = True
        self._close_activations()
        with own_forwards():  # the replay is not the loop's evaluation
            if self._replay is not None:
                self.nan_module = probes.first_nonfinite_module(self.model, self._replay)
            elif self._last_inputs is not None:
                args, kwargs = self._last_inputs
                self.nan_module = probes.first_nonfinite_module(
                    self.model, lambda: self.model(*args, **kwargs)
                )
        tags = {OUTCOME_TAG: "diverged", NAN_UPDATES_TAG: str(self.steps)}
        self.steps += 1
        self.tokens += self.tokens_per_step or self._step_tokens * self.world
        self._log({"train/loss": float("nan")})
        if self.nan_module:
            tags[NAN_MODULE_TAG] = self.nan_module
        if tracker := self._open():
            tracker.set_tags(tags)

    def _params_on_cpu(self) -> dict[str, torch.Tensor]:
        return {n: _full_param(p).detach().float().cpu().clone() for n, p in self.named}

    def _lr(self) -> float:
        """The LR of the optimizer's first group now (0 without one the probe can read)."""
        groups = getattr(self.optimizer, "param_groups", None)
        return float(groups[0]["lr"]) if groups else 0.0

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------ MLflow

    def _open(self):
        """The tracker, opened on first use on rank 0 (other ranks log nothing)."""
        if self._tracker is None and self.rank == 0 and not self._closed:
            from hyprun.runner.store.tracking import open_app_run

            self._tracker, self._owned = open_app_run(self._experiment, self._run_name)
            self._tracker.set_tags(self._describe())
        return self._tracker

    def _describe(self) -> dict[str, str]:
        """What the run's evidence is and is not: diagnose reads these."""
        return {
            "hyprun.source": "probe",
            "hyprun.step_unit": self.step_unit,
            "hyprun.world_size": str(self.world),
            "hyprun.device": self._device().type,
            "hyprun.blocks": self.blocks_path or "none found",
            SCAN_TAG: self._scan_state(),
            **({VOCAB_TAG: str(vocab)} if (vocab := lm_vocab(self.model)) else {}),
        }

    def _scan_state(self) -> str:
        if not self.switches["step_scan"]:
            return "off: step_scan=False"
        return "on" if self.scan_off is None else f"off: {self.scan_off}"

    def _log(self, metrics: dict[str, float]) -> None:
        tracker = self._open()
        if tracker is not None:
            step = self.tokens if self.step_unit == "tokens" else self.steps
            tracker.log_metrics(metrics, step=step)


# ---------------------------------------------------------------- helpers


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


def _mean_over_ranks(value: float, world: int) -> float:
    if world == 1:
        return value
    total = torch.tensor([value], dtype=torch.float64)
    if torch.distributed.get_backend() == "nccl":
        total = total.cuda()
    torch.distributed.all_reduce(total)
    return float(total.item()) / world


def _uses_deepspeed(param: torch.nn.Parameter) -> bool:
    """Whether DeepSpeed owns this parameter's gradient (ZeRO partitions or fp32 master copy)."""
    return hasattr(param, "ds_id") or getattr(param, "_hp_mapping", None) is not None


def _one_device(params: list[nn.Parameter]) -> list[nn.Parameter]:
    """The weights the rewrite read can hold in one tensor: on the first one's device, and not
    sharded or mirrored by DeepSpeed (whose engine writes them back after its own step)."""
    own = [p for p in params if not _uses_deepspeed(p)]
    return [p for p in own if p.device == own[0].device] if own else []


def _elements(param: torch.nn.Parameter) -> int:
    """A parameter's element count, whole under ZeRO-3 (which leaves each rank a shard)."""
    return int(getattr(param, "ds_numel", param.numel()))


def _full_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    """The whole gradient: DeepSpeed gathers it under ZeRO (as the job does), else `.grad`."""
    if _uses_deepspeed(param):
        from hyprun.runner.job.instrument import full_grad

        return full_grad(param)
    return param.grad


def _full_param(param: torch.nn.Parameter) -> torch.Tensor:
    if _uses_deepspeed(param):
        from hyprun.runner.job.instrument import full_param

        return full_param(param)
    return param.data


def _weight_rms(params: list[nn.Parameter]) -> float | None:
    """The RMS per element of the trainable weights (None under DeepSpeed, which shards them)."""
    if not params or any(_uses_deepspeed(p) for p in params):
        return None
    squares = sum(float(p.detach().float().pow(2).sum()) for p in params)
    return math.sqrt(squares / sum(p.numel() for p in params))


def identical_rows(named: list[tuple[str, nn.Parameter]]) -> list[str]:
    """Weights on the loss's path (a .grad) of two or more rows (units) whose rows are all
    equal (a whole DeepSpeed shard is not read)."""
    identical = []
    for name, param in named:
        if param.dim() < 2 or param.shape[0] < 2 or param.grad is None or _uses_deepspeed(param):
            continue
        rows = param.detach().reshape(param.shape[0], -1)
        if bool((rows == rows[:1]).all()):
            identical.append(name)
    return identical


def zero_grad_moved(
    names: list[str],
    before: list[torch.Tensor],
    after: list[torch.Tensor],
    grads: list[torch.Tensor | None],
) -> list[str]:
    """The tensors whose whole gradient is zero (not None: None leaves a tensor out of the
    step) that the step still changed: weight decay or momentum moved a frozen weight. A
    gradient not whole (DeepSpeed's shards) or not finite is not read."""
    moved = []
    for name, old, new, grad in zip(names, before, after, grads, strict=True):
        if grad is None or grad.shape != new.shape or not bool(torch.isfinite(grad).all()):
            continue
        if not bool(grad.any()) and not torch.equal(new, old.to(new.device)):
            moved.append(name)
    return moved


def eps_dominated(optimizer: Any) -> tuple[int, int] | None:
    """(elements whose bias-corrected second moment's root is below their group's eps,
    elements with a non-zero second moment) over an Adam-family optimizer's state: what eps
    weighs against the gradients the steps really used. None: no such state (another family,
    no step taken yet)."""
    optimizer = unwrapped(optimizer)
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    bound, counted = 0, 0
    for group in optimizer.param_groups:
        eps, betas = group.get("eps"), group.get("betas")
        if eps is None or betas is None:
            continue
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            second, step = state.get("exp_avg_sq"), state.get("step")
            if second is None or step is None or float(step) < 1:
                continue
            held = second.detach().float()
            root = (held / (1 - float(betas[1]) ** float(step))).sqrt()
            counted += int((held > 0).sum())
            bound += int(((held > 0) & (root < eps)).sum())
    return (bound, counted) if counted else None


def dropout_rates(model: nn.Module) -> dict[str, float]:
    """Every dropout rate the model declares, by "module.attribute": a dropout module's p and a
    module's float attribute named for dropout (nn.MultiheadAttention's `dropout`, an
    attention's `dropout_p`)."""
    rates = {}
    for name, module in model.named_modules():
        for attribute, value in vars(module).items():
            is_rate = "drop" in attribute.lower() or (
                attribute == "p" and isinstance(module, nn.modules.dropout._DropoutNd)
            )
            if is_rate and isinstance(value, float):
                rates[f"{name}.{attribute}" if name else attribute] = value
    return rates


def gradient_weight_cosine(
    weights: list[torch.Tensor], grads: list[torch.Tensor | None]
) -> float | None:
    """The cosine between the gradient and the weights, pooled over every weight matrix (two or
    more dims) with a whole gradient: how much of the gradient points along the weights
    themselves. A data loss's gradient has no reason to (healthy runs read near 0); a penalty on
    the weights' norm, wd x sum(w**2), points straight along them (1). None: no matrix with a
    finite gradient."""
    sums = []  # (g.w, g.g, w.w) per matrix, read back in one transfer
    for weight, grad in zip(weights, grads, strict=True):
        if grad is None or weight.dim() < 2 or grad.shape != weight.shape:
            continue
        grad, weight = grad.detach().float().flatten(), weight.to(grad.device).flatten()
        sums.append(torch.stack([grad.dot(weight), grad.dot(grad), weight.dot(weight)]).double())
    if not sums:
        return None
    dot, grad_square, weight_square = (
        torch.stack([t.to(sums[0].device) for t in sums]).sum(0).tolist()
    )
    total = dot + grad_square + weight_square
    if grad_square <= 0 or weight_square <= 0 or not math.isfinite(total):
        return None
    return dot / math.sqrt(grad_square * weight_square)


def lost_updates(
    before: list[torch.Tensor], after: list[torch.Tensor], grads: list[torch.Tensor | None]
) -> tuple[int, int] | None:
    """(elements with a non-zero gradient that a step left unchanged, elements with a non-zero
    gradient), from the parameters before and after it; None when a gradient is not finite (a
    loss scaler skipped the step), none is non-zero, or one is not whole (DeepSpeed's)."""
    lost, counted = 0, 0
    for old, new, grad in zip(before, after, grads, strict=True):
        if grad is None:
            continue
        if grad.shape != new.shape or not bool(torch.isfinite(grad).all()):
            return None
        reached = grad != 0
        counted += int(reached.sum())
        lost += int((reached & (new == old.to(new.device))).sum())
    return (lost, counted) if counted else None


def _all_finite(losses: list[torch.Tensor]) -> bool:
    return bool(torch.isfinite(torch.stack([t.float().reshape(()) for t in losses])).all())


def _as_tensor(loss: torch.Tensor | float) -> torch.Tensor:
    return loss.detach() if torch.is_tensor(loss) else torch.tensor(float(loss))


def _loss_of(output: Any) -> torch.Tensor | None:
    """The loss a forward returned: a scalar tensor, `.loss` (Hugging Face), or `["loss"]`."""
    if torch.is_tensor(output):
        return output if output.numel() == 1 else None
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    return loss if torch.is_tensor(loss) and loss.numel() == 1 else None


def _count_tokens(batch: Any) -> int:
    """Tokens in a batch: the `input_ids` (or the first integer tensor) found in it."""
    if torch.is_tensor(batch):
        return batch.numel() if not batch.is_floating_point() else 0
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        if torch.is_tensor(ids := batch.get("input_ids")):
            return ids.numel()
        batch = list(batch.values())
    if isinstance(batch, tuple | list):
        for item in batch:
            if count := _count_tokens(item):
                return count
    return 0


def _sequence_length(batch: Any) -> int:
    """The last dimension of the batch's token ids (0 when none is found)."""
    if torch.is_tensor(batch):
        return batch.shape[-1] if not batch.is_floating_point() and batch.dim() else 0
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        if torch.is_tensor(ids := batch.get("input_ids")):
            return ids.shape[-1]
        batch = list(batch.values())
    if isinstance(batch, tuple | list):
        for item in batch:
            if length := _sequence_length(item):
                return length
    return 0


def lm_vocab(model: nn.Module) -> int | None:
    """The vocabulary a language model predicts over: its token embedding's rows, when its last
    linear layer (the LM head) maps back onto as many outputs. A classifier that embeds tokens
    ends in a head onto its classes, and its loss is not judged against ln(vocab)."""
    embedding = _input_embedding(model)
    weight = getattr(embedding, "weight", None)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if weight is None or weight.dim() != 2 or not linears:
        return None
    rows = int(weight.shape[0])
    return rows if linears[-1].out_features == rows else None


def _input_embedding(model: nn.Module) -> nn.Module | None:
    """The token embedding: Hugging Face's `get_input_embeddings()`, the built-in GPT's
    `tok_emb`, else the first `nn.Embedding`."""
    getter = getattr(model, "get_input_embeddings", None)
    if callable(getter):
        try:
            found = getter()
        except (NotImplementedError, AttributeError):
            found = None
        if isinstance(found, nn.Module) and hasattr(found, "weight"):
            return found
    if isinstance(getattr(model, "tok_emb", None), nn.Module):
        return model.tok_emb
    return next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)


def _flops_per_token(model: nn.Module, given: float | None, seq_len: int) -> tuple[float, str]:
    """(FLOPs per token, where the number came from); `seq_len` is the attention context seen
    (0: unknown, the config's maximum is used)."""
    if given:
        return float(given), "given"
    if callable(getattr(model, "flops_per_token", None)):
        return float(model.flops_per_token()), "model.flops_per_token()"
    embedding = _input_embedding(model)
    n_embedding = embedding.weight.numel() if embedding is not None else 0
    n_params = sum(p.numel() for p in model.parameters()) - n_embedding
    config = _hf_config(model)
    if config is not None:
        layers, heads, width, context = config
        context = seq_len or context
        flops = transformer_flops_per_token(n_params, layers, heads, width // heads, context)
        return flops, "6N + 12LHQT from the model's config"
    return 6.0 * n_params, "6N (no attention term: unknown architecture)"


def _hf_config(model: nn.Module) -> tuple[int, int, int, int] | None:
    """(layers, heads, width, context) of a Hugging Face transformer found in `model`."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is None:
            continue
        names = {
            "layers": ("num_hidden_layers", "n_layer"),
            "heads": ("num_attention_heads", "n_head"),
            "width": ("hidden_size", "n_embd"),
            "context": ("max_position_embeddings", "n_positions", "n_ctx"),
        }
        found = [
            next((getattr(config, n) for n in keys if hasattr(config, n)), None)
            for keys in names.values()
        ]
        if all(isinstance(v, int) and v > 0 for v in found):
            return tuple(found)
    return None


def _precision(model: nn.Module) -> str:
    dtype = next(model.parameters()).dtype
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def _forward(model: nn.Module, batch: Any) -> Any:
    """The model on a batch as its loop would call it: keywords for a mapping (Hugging Face),
    positions for a tuple or list, the batch itself otherwise."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, tuple | list):
        return model(*batch)
    return model(batch)


def _to_device(batch: Any, device: torch.device) -> Any:
    if torch.is_tensor(batch):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def unwrapped(optimizer: Any) -> Any:
    """The torch optimizer a trainer's wrapper holds in `.optimizer` (Accelerate's
    AcceleratedOptimizer under the HF Trainer, Lightning's LightningOptimizer): its class is the
    family the L0 bands are kept for."""
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer


def schedulers_of(optimizer: Any) -> list[torch.optim.lr_scheduler.LRScheduler]:
    """The live LR schedulers on `optimizer`: a scan of the live objects, as nothing links an
    optimizer to its schedulers (read once, at the first backward)."""
    inner = unwrapped(optimizer)
    owners = {id(optimizer), id(inner)}
    return [
        found
        for found in gc.get_objects()
        if isinstance(found, torch.optim.lr_scheduler.LRScheduler)
        and id(getattr(found, "optimizer", None)) in owners
    ]


def schedulers_stepped_early(optimizer: Any, schedulers: list) -> dict[str, int] | None:
    """{scheduler: its steps} of the LR `schedulers` on `optimizer` already stepped past their
    construction before the optimizer's first step (torch warns of it once: "Detected call of
    lr_scheduler.step() before optimizer.step()"); None: no scheduler on it, or an optimizer
    that stepped before (a resume, whose loaded state carries the scheduler's count too)."""
    inner = unwrapped(optimizer)
    if inner is None or getattr(inner, "_opt_called", False) or getattr(inner, "state", None):
        return None
    if not schedulers:
        return None
    # the constructor's own step leaves _step_count at 1
    early = {type(s).__name__: getattr(s, "_step_count", 1) - 1 for s in schedulers}
    return {name: steps for name, steps in early.items() if steps > 0}


def keeps_grads(optimizer: Any) -> bool:
    """Whether the gradients stay in the parameters' .grad between backwards: a torch optimizer
    (under any trainer's wrapper) does; a DeepSpeed ZeRO optimizer moves them out after each."""
    return isinstance(unwrapped(optimizer), torch.optim.Optimizer)


def read_optimizer(facts: LiveFacts, optimizer: Any, named: list[tuple[str, nn.Parameter]]) -> None:
    """The optimizer's class, peak and current LR, weight decay, betas; the 1-D parameters it
    decays and the trainable ones it does not hold (a torch optimizer's groups only: a
    DeepSpeed engine's hold flattened copies)."""
    groups = getattr(optimizer, "param_groups", None) or []
    if not groups:
        return
    first = groups[0]
    facts.optimizer = type(unwrapped(optimizer)).__name__
    facts.first_lr = float(first["lr"])
    facts.peak_lr = float(first.get("max_lr") or first.get("initial_lr") or first["lr"])
    facts.weight_decay = max(float(g.get("weight_decay", 0.0) or 0.0) for g in groups)
    betas = first.get("betas")
    facts.betas = (float(betas[0]), float(betas[1])) if betas is not None else None
    facts.adam_eps = float(first["eps"]) if first.get("eps") is not None else None
    facts.momentum = float(first["momentum"]) if first.get("momentum") is not None else None
    facts.decoupled_decay = bool(first.get("decoupled_weight_decay", False))
    if not isinstance(optimizer, torch.optim.Optimizer):
        return
    held = {id(p) for g in groups for p in g["params"]}
    decayed = {id(p) for g in groups if g.get("weight_decay", 0.0) for p in g["params"]}
    facts.missing_from_optimizer = [n for n, p in named if id(p) not in held]
    facts.decayed_norms_biases = [n for n, p in named if p.dim() <= 1 and id(p) in decayed]


def read_invariants(
    facts: LiveFacts,
    hooks: InvariantHooks,
    total_steps: int | None,
    epoch_steps: int | None = None,
) -> None:
    """What the invariant hooks saw so far, into the facts the L0 checks read."""
    facts.stale_grads = dict(hooks.stale)
    facts.emptied_grads = dict(hooks.emptied)
    facts.eval_at_train = sorted(hooks.eval_at_train)
    facts.train_at_eval = sorted(hooks.train_at_eval)
    facts.trainable_elements, facts.total_elements = hooks.trainable_elements, hooks.total_elements
    facts.lrs, facts.total_steps = list(hooks.lrs), total_steps
    facts.eval_only_target = hooks.eval_targets.unseen(hooks.trained_targets)
    advances = hooks.scheduler_advances
    facts.scheduler_advances = {name: list(steps) for name, steps in advances.items()} or None
    facts.stream, facts.epoch_steps = list(hooks.stream), epoch_steps
    facts.epoch_rows = list(hooks.epoch_rows)
    facts.loss_inputs = list(hooks.loss_inputs)
    facts.nll_inputs = list(hooks.nll_inputs)
    facts.soft_targets = list(hooks.soft_targets)
    facts.eval_gap, facts.future_influence = hooks.eval_gap, hooks.future_influence
    facts.stream_pairs, facts.linear_chains = hooks.stream_pairs, hooks.linear_chains
    facts.state_resets = list(hooks.state_resets) if hooks.state_reads >= 2 else None
    facts.weight_rewrites = hooks.weight_rewrites()
    facts.padding_idx_attended = hooks.padding_idx_attended
    facts.unbacked_steps = list(hooks.unbacked) if hooks.read_accumulation else None
    facts.train_eval_scale = hooks.train_eval_scale
    if hooks.attention is not None:
        facts.attention_scales = list(hooks.attention.scales)
        facts.attention_rows = list(hooks.attention.unnormalised)
    if hooks.heldout_rows:
        facts.heldout_overlap = (len(hooks.heldout_seen), len(hooks.heldout_rows))
    facts.label_reads = list(hooks.label_reads)
    facts.heldout_labels = hooks.heldout_labels
    facts.row_influence = hooks.row_influence
    facts.index_influence = hooks.index_influence
    facts.stream_zeros = hooks.stream_zeros
    facts.twin_calls = hooks.twin_calls or None
    facts.loss_logit_scale = hooks.loss_logit_scale
    facts.cut_unused = [name for name in facts.no_grad if name in hooks.detached_reads]
    if hooks.dropout_calls is not None and hooks.dropout_calls.applied:
        calls = hooks.dropout_calls
        facts.dropout_calls = (calls.applied, calls.discarded, calls.stacked)
    facts.padding_influence = hooks.padding_influence
    if hooks.heldout_ids is not None and hooks.train_id_max is not None:
        beyond = int((hooks.heldout_ids > hooks.train_id_max).sum())
        facts.ids_beyond_training = (beyond, hooks.heldout_ids.numel())
    facts.padding_reads = list(hooks.padding_reads)
    if hooks.padding_reads:
        facts.masked_token = hooks.never_taught()
    facts.accumulation = hooks.accumulation_reads()
    facts.single_steps = hooks.single_step_reads()
    facts.step_forwards = hooks.forwards_per_step()
    facts.step_norms = list(hooks.step_norms)
    facts.batch_prints = list(hooks.batch_prints)


def shared_blocks(path: str | None, blocks: nn.ModuleList | None) -> list[str] | None:
    """Blocks of the residual stack that share a parameter with an earlier block (one module
    appended n times: `nn.ModuleList([block] * n)`); None: no stack found."""
    if blocks is None:
        return None
    seen: set[int] = set()
    shared = []
    for index, block in enumerate(blocks):
        own = {id(p) for p in block.parameters()}
        if own & seen:
            shared.append(f"{path}.{index}")
        seen |= own
    return shared


def freeze_ignored(model: nn.Module) -> dict[str, int]:
    """{module: its parameters still requiring grad} for modules given requires_grad=False as
    a plain attribute (nn.Module defines no such attribute: only an assignment puts it in the
    instance's __dict__)."""
    found = {}
    for name, module in model.named_modules():
        if vars(module).get("requires_grad") is False:
            training = sum(p.requires_grad for p in module.parameters())
            if training:
                found[name or "the model"] = training
    return found


def untied_heads(model: nn.Module) -> list[str] | None:
    """Hugging Face models in `model` whose config declares tie_word_embeddings while the
    output head's weight is not the token embedding's tensor; None: none declares a tie."""
    declared = None
    for name, module in model.named_modules():
        if not getattr(getattr(module, "config", None), "tie_word_embeddings", False):
            continue
        try:
            head, embedding = module.get_output_embeddings(), module.get_input_embeddings()
        except (AttributeError, NotImplementedError):
            continue
        if head is None or embedding is None:
            continue
        declared = declared or []
        if head.weight.data_ptr() != embedding.weight.data_ptr():
            declared.append(name or "the model")
    return declared


def dropout_max(model: nn.Module) -> tuple[float, list[str]] | None:
    """(the largest dropout rate among nn.Dropout modules and nn.MultiheadAttention's own,
    the modules at it); None: no rate above 0."""
    rates = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd | nn.MultiheadAttention):
            rate = float(module.p if hasattr(module, "p") else module.dropout)
            if rate > 0:
                rates[name] = rate
    if not rates:
        return None
    top = max(rates.values())
    return top, [name for name, rate in rates.items() if rate == top]


def norm_gains(model: nn.Module) -> dict[str, float]:
    """The RMS of each torch norm layer's gain (nn.LayerNorm, nn.RMSNorm; torch starts it at 1).
    A model's own norm classes are not read: some store the gain as 1 + w (Gemma's), w at 0."""
    return {
        name: float(module.weight.detach().float().pow(2).mean().sqrt())
        for name, module in model.named_modules()
        if isinstance(module, model_checks.NORMS) and getattr(module, "weight", None) is not None
    }


def read_model(facts: LiveFacts, model: nn.Module) -> None:
    """The largest dropout rate of its modules (nn.Dropout, attention's own); the RMS of torch's
    norm layers' gains; width and heads for the LR band: a Hugging Face config's, else the
    token embedding's."""
    facts.dropout_max = dropout_max(model)
    facts.norm_gains = norm_gains(model)
    config = _hf_config(model)
    if config is not None:
        facts.heads, facts.width = config[1], config[2]
        return
    embedding = _input_embedding(model)
    if embedding is not None and embedding.weight.dim() == 2:
        facts.width = int(embedding.weight.shape[1])
