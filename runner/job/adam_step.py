"""How far beyond Adam's own bound an optimizer that calls itself Adam stepped.

Adam's step on an element is LR x m_hat / (sqrt(v_hat) + eps). By Cauchy-Schwarz on the two
moments' sums, whatever the gradients, |m_hat| / sqrt(v_hat) never exceeds

    (1 - beta1) / sqrt((1 - beta2) (1 - beta1**2 / beta2))

(7.27 at the usual betas 0.9, 0.999; the bias corrections only lower it, as
(1 - r**t)(1 - beta2**t) <= (1 - beta1**t)**2 for r = beta1**2 / beta2). The bound holds for
any gradient sequence, clipped, scaled or sparse, so a step beyond it is no property of the
data: the optimizer's own arithmetic is wrong (a bias correction written into its buffer, a
correction inverted; frgfm/holocron#1, kozistr/pytorch_optimizer PR 308). Where beta1**2 >=
beta2 there is no bound, and nothing is judged.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import nn

ADAM_NAMES = re.compile(r"adam", re.IGNORECASE)
"""Optimizer classes that call themselves Adam: torch's Adam and AdamW, DeepSpeed's, a loop's
own."""
NOT_BOUNDED = re.compile(r"(?<![A-Z])(?:R|N|P|QH)Adam|(?i:adabelief|lamb|schedulefree)")
"""Adam's relatives whose step is not Adam's (RAdam's first steps are plain momentum, NAdam's
and QHAdam's add the raw gradient, AdaBelief divides by the gradient's deviation, LAMB scales
by a trust ratio): they carry Adam in their name, not its bound."""
ROUNDING = 4 * torch.finfo(torch.float32).eps
"""A float32 element's rounding, relative to its value, allowed twice over in the measured
step: the update and the decay each round the weight once."""


def adam_bound(betas: tuple[float, float]) -> float | None:
    """The largest |step| / LR Adam takes with these betas; None where beta1**2 >= beta2."""
    beta1, beta2 = float(betas[0]), float(betas[1])
    if not 0 <= beta1 < 1 or not 0 < beta2 < 1 or beta1**2 >= beta2:
        return None
    return (1 - beta1) / math.sqrt((1 - beta2) * (1 - beta1**2 / beta2))


def calls_itself_adam(optimizer: Any) -> bool:
    """torch's Adam or AdamW, or a class named for Adam that is not one of its relatives."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return True
    name = type(optimizer).__name__
    return bool(ADAM_NAMES.search(name)) and not NOT_BOUNDED.search(name)


def steps_beyond_bound(
    optimizer: Any,
    named: list[tuple[str, nn.Parameter]],
    before: dict[str, torch.Tensor],
    now: list[torch.Tensor],
    lrs: list[float],
) -> tuple[float, int, int] | None:
    """(the largest step over its bound, elements stepped beyond it, elements judged) for one
    optimizer step, from the weights before and after it. `lrs`: each group's LR when the step
    began (the larger of it and the LR now is used, so a schedule stepped in between only lowers
    the read). The decoupled decay LR x wd x w is taken out where that lowers the step (AdamW's;
    Adam's L2 decay is in its gradient, within the bound). Judged: float32/64 weights of an
    optimizer that calls itself Adam; None where nothing is judged."""
    if not isinstance(optimizer, torch.optim.Optimizer) or not calls_itself_adam(optimizer):
        return None
    groups = {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
    reads = []  # (largest ratio, elements beyond, elements) per tensor, read back at once
    for (name, param), after in zip(named, now, strict=True):
        index = groups.get(id(param))
        if index is None or param.dtype not in (torch.float32, torch.float64):
            continue
        group = optimizer.param_groups[index]
        bound = adam_bound(group.get("betas", (1.0, 1.0)))
        lr = max(float(group["lr"]), lrs[index] if index < len(lrs) else 0.0)
        if bound is None or lr <= 0:
            continue
        old = before[name].to(after.device)
        step = (after - old).abs()
        decay = lr * float(group.get("weight_decay", 0.0))
        step = torch.minimum(step, (after - old * (1 - decay)).abs())
        ratio = (step - ROUNDING * (old.abs() + after.abs())) / (lr * bound)
        finite = torch.isfinite(ratio)
        ratio = torch.where(finite, ratio, torch.zeros_like(ratio))
        reads.append(torch.stack([ratio.max(), (ratio > 1).sum(), finite.sum()]).double())
    if not reads:
        return None
    table = torch.stack([read.to(reads[0].device) for read in reads]).cpu()  # one transfer
    worst, beyond, judged = float(table[:, 0].max()), int(table[:, 1].sum()), int(table[:, 2].sum())
    return (worst, beyond, judged) if judged else None


def first_moments(optimizer: Any) -> tuple[float, float] | None:
    """After an Adam optimizer's first step, (its first moment over (1 - beta1) x the gradient,
    its second moment over (1 - beta2) x the squared gradient), summed over the parameters whose
    state is at step 1: both exactly 1 for Adam's update m = beta1 m + (1 - beta1) g, v = beta2 v
    + (1 - beta2) g^2 from zero, whatever the gradient. The gradient read is the .grad the step
    used (clipped and unscaled in place); a coupled L2 decay adds to it inside the step, so
    groups of a class that is not AdamW with weight_decay > 0 are not read. None: no optimizer
    that calls itself Adam, or no state at step 1 with its gradient."""
    if not isinstance(optimizer, torch.optim.Optimizer) or not calls_itself_adam(optimizer):
        return None
    decoupled = "adamw" in type(optimizer).__name__.lower()
    reads = []  # per tensor, read back at once
    for group in optimizer.param_groups:
        beta1, beta2 = group.get("betas", (None, None))
        if beta1 is None or (group.get("weight_decay", 0) and not decoupled):
            continue
        for param in group["params"]:
            state, grad = optimizer.state.get(param, {}), param.grad
            first, second = state.get("exp_avg"), state.get("exp_avg_sq")
            if grad is None or first is None or second is None or float(state.get("step", 0)) != 1:
                continue
            grad = grad.detach().double()
            read = torch.stack(
                [
                    first.detach().double().abs().sum(),
                    (1 - beta1) * grad.abs().sum(),
                    second.detach().double().sum(),
                    (1 - beta2) * grad.pow(2).sum(),
                ]
            )
            reads.append(read)
    if not reads:
        return None
    sums = torch.stack([read.to(reads[0].device) for read in reads]).sum(0).cpu()
    if sums[1] <= 0 or sums[3] <= 0:
        return None
    return float(sums[0] / sums[1]), float(sums[2] / sums[3])
