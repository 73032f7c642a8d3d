"""Training invariants: cheap checks that a loop does what it was written to do.

In the spirit of TrainCheck (OSDI '25): facts that hold in every healthy training loop, read
from a few numbers per step, whose violation names a silent bug directly, where a loss curve
only shows its harm. Pure functions on numbers a probe collects (the hook each needs is in its
docstring); no torch, no MLflow. Each returns the violations it found, empty when the
invariant holds.

Thresholds are for exactly-zero-or-not facts where possible (a gradient left over, a parameter
missing from the optimizer); where a ratio is read, its cut is far from what a healthy loop can
produce (documented beside it), not fitted between two runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

STALE_GRAD_TOL = 0.0
"""A gradient at the start of a step (before its first backward) must be exactly zero or
absent: zero_grad() sets None or 0, so any non-zero value is left over from an earlier step."""
ACCUM_SCALE_TOL = 0.05
"""The loss backpropagated over one optimizer step, against the step's token-weighted mean
loss: 1.0 exactly in a correct loop (up to float rounding, < 1e-6); a loss not divided by k
accumulation steps reads k, a mean of micro-batch means reads the token-weight mismatch."""
SCHEDULE_COLLAPSE = 1e-3
"""An LR below this fraction of its peak while more than half the run remains: no schedule in
common use (cosine, linear, step, WSD) gets there before its last half; StepLR stepped per batch
instead of per epoch does within a few epochs' worth of steps."""
FROZEN_SHARE = 0.9
"""Share of a model's parameters (elements) frozen above which a run that also stops learning
is read as frozen by mistake: an L0 warning (fine-tuning freezes most parameters on purpose)
that becomes a finding only with the harm it predicts (a flat loss)."""


@dataclass(frozen=True)
class Violation:
    """One invariant broken: which, where (step or parameter), and the numbers that show it."""

    invariant: str
    where: str
    evidence: str


def modules_not_training(training: Mapping[str, bool]) -> list[Violation]:
    """Modules whose behaviour depends on the mode (dropout, batch norm) found in eval mode
    during a training forward. Hook: at each training forward, `{name: module.training}` for
    the model's dropout and norm modules with running statistics."""
    return [
        Violation("train_mode_while_training", name, "module.training is False at a train step")
        for name, is_training in training.items()
        if not is_training
    ]


def modules_training_at_eval(training: Mapping[str, bool]) -> list[Violation]:
    """Mode-dependent modules still in train mode during an evaluation forward (dropout active
    while the held-out loss is measured). Hook: at each forward without grad enabled,
    `{name: module.training}` for the same modules."""
    return [
        Violation("eval_mode_while_evaluating", name, "module.training is True at an eval step")
        for name, is_training in training.items()
        if is_training
    ]


def stale_gradients(norm_at_step_start: Mapping[int, float]) -> list[Violation]:
    """Optimizer steps that began with a gradient left over from an earlier one.
    `norm_at_step_start`: by optimizer step, the norm of the `.grad`s already there when that
    step's first backward reached each parameter (None counts as 0). Hook: a tensor hook on
    each parameter reads its .grad on the first backward after a step, before the new gradient
    is added (later backwards of the same step accumulate on purpose)."""
    return [
        Violation("grads_reset_between_steps", f"step {step}", f"|grad| = {norm:.3g} at start")
        for step, norm in norm_at_step_start.items()
        if not math.isfinite(norm) or norm > STALE_GRAD_TOL
    ]


def params_without_gradient(trainable: Sequence[str], with_grad: Sequence[str]) -> list[Violation]:
    """Trainable parameters that received no gradient in a step's backward (not used in the
    loss, or detached). Hook: after backward, names with requires_grad, and names whose .grad
    is not None."""
    got = set(with_grad)
    return [
        Violation("every_trainable_param_gets_a_gradient", name, "requires_grad, .grad is None")
        for name in trainable
        if name not in got
    ]


def params_not_in_optimizer(trainable: Sequence[str], optimized: Sequence[str]) -> list[Violation]:
    """Trainable parameters no optimizer param group holds (a layer replaced after the optimizer
    was built). Hook: at the first step, names with requires_grad, and names of the tensors in
    optimizer.param_groups (matched by identity)."""
    held = set(optimized)
    return [
        Violation("every_trainable_param_is_optimized", name, "in no optimizer param group")
        for name in trainable
        if name not in held
    ]


def accumulation_scale(
    backpropagated: Sequence[float], summed_losses: Sequence[float], tokens: Sequence[int]
) -> list[Violation]:
    """An optimizer step whose backpropagated loss is not the step's token-weighted mean.
    `backpropagated`: the scalars each micro-batch called backward() on; `summed_losses`: each
    micro-batch's loss summed over its tokens; `tokens`: its token count. Hook: the probe's
    after_backward per micro-batch, with the loss's sum and count (the loss function's
    reduction='sum' twin, or mean x count)."""
    total = sum(tokens)
    if total <= 0 or not backpropagated:
        return []
    expected = sum(summed_losses) / total
    read = sum(backpropagated)
    if expected == 0 or not math.isfinite(read):
        return []
    ratio = read / expected
    if abs(ratio - 1) <= ACCUM_SCALE_TOL:
        return []
    return [
        Violation(
            "loss_scale_under_accumulation",
            f"{len(backpropagated)} micro-batches",
            f"backpropagated {read:.4g} vs token mean {expected:.4g} (x{ratio:.3g})",
        )
    ]


def schedule_collapse(lrs: Sequence[float], total_steps: int) -> list[Violation]:
    """The LR fell below SCHEDULE_COLLAPSE of its peak in the first half of the run. `lrs`:
    the optimizer's LR after each step so far (param group 0). Hook: after each step."""
    peak = 0.0
    for step, lr in enumerate(lrs):
        peak = max(peak, lr)
        if step < total_steps / 2 and peak > 0 and lr < SCHEDULE_COLLAPSE * peak:
            return [
                Violation(
                    "lr_schedule_collapse",
                    f"step {step} of {total_steps}",
                    f"LR {lr:.3g} is {lr / peak:.2g} of its peak {peak:.3g}",
                )
            ]
    return []


def mostly_frozen(trainable_elements: int, total_elements: int) -> list[Violation]:
    """More than FROZEN_SHARE of the parameters frozen (an L0 warning; see FROZEN_SHARE). Hook:
    once, at attach: element counts of parameters with and without requires_grad."""
    if total_elements <= 0:
        return []
    frozen = 1 - trainable_elements / total_elements
    if frozen <= FROZEN_SHARE:
        return []
    return [Violation("params_frozen", "model", f"{frozen:.1%} of parameter elements frozen")]


def replicas_disagree(checksums: Sequence[float], rel_tol: float = 1e-6) -> list[Violation]:
    """Data-parallel replicas whose parameters differ after a step. `checksums`: one per rank
    (the sum of every parameter, in float64). Hook: after a step, all_gather of a checksum."""
    if len(checksums) < 2:
        return []
    reference = checksums[0]
    return [
        Violation("replicas_agree", f"rank {rank}", f"checksum {value:.10g} vs {reference:.10g}")
        for rank, value in enumerate(checksums[1:], start=1)
        if not math.isclose(value, reference, rel_tol=rel_tol, abs_tol=1e-12)
    ]
