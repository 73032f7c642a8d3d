"""Learning-rate schedules as LR multipliers over training progress.

A schedule maps (step, total_steps) to a multiplier of the optimizer's peak LR. Defining them over
the fraction of the token budget (not absolute steps) keeps a batch-size hypothesis comparable:
the same schedule shape is traced whatever the number of steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Schedule:
    warmup_frac: float = 0.0
    """Fraction of the budget over which the LR rises linearly from ~0 to the peak."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.warmup_frac < 1.0:
            raise ValueError(
                f"sched.warmup_frac={self.warmup_frac} is outside [0, 1): "
                "set a fraction of the budget"
            )

    def __call__(self, step: int, total_steps: int) -> float:
        warmup = int(self.warmup_frac * total_steps)
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return self.after_warmup(min(1.0, progress))

    def after_warmup(self, progress: float) -> float:
        """Multiplier at `progress` in [0, 1] of the post-warmup part of training."""
        raise NotImplementedError


@dataclass
class Constant(Schedule):
    def after_warmup(self, progress: float) -> float:
        return 1.0


@dataclass
class Cosine(Schedule):
    min_lr_ratio: float = 0.1
    """Final LR as a fraction of the peak."""

    def after_warmup(self, progress: float) -> float:
        return _cosine(progress, self.min_lr_ratio)


@dataclass
class CosineWarmRestarts(Schedule):
    """SGDR (Loshchilov & Hutter): cosine cycles that restart at the peak LR."""

    cycles: int = 4
    """Number of cycles within the budget."""
    t_mult: float = 1.0
    """Each cycle is t_mult times longer than the previous one."""
    min_lr_ratio: float = 0.01

    def after_warmup(self, progress: float) -> float:
        lengths = [self.t_mult**i for i in range(self.cycles)]
        position = progress * sum(lengths)
        for length in lengths:
            if position < length:
                return _cosine(position / length, self.min_lr_ratio)
            position -= length
        return self.min_lr_ratio


@dataclass
class WarmupStableDecay(Schedule):
    """WSD: hold the peak, then decay linearly over the last `decay_frac` of the budget."""

    decay_frac: float = 0.2
    min_lr_ratio: float = 0.0

    def after_warmup(self, progress: float) -> float:
        decay_start = 1.0 - self.decay_frac
        if progress < decay_start:
            return 1.0
        done = (progress - decay_start) / max(self.decay_frac, 1e-12)
        return 1.0 - (1.0 - self.min_lr_ratio) * done


def _cosine(progress: float, floor: float) -> float:
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
