"""The hooks diag/invariants.py needs, on any torch model and optimizer: what a probe would
collect for them (runner/job/probe.py is where they belong; this is the bench's own copy, to
measure the invariants before they are wired in). Torch hooks only; the loop is not changed."""

from __future__ import annotations

import math

import torch
from torch import nn

from hyprun.diag import invariants

MODE_MODULES = (nn.Dropout, nn.modules.batchnorm._BatchNorm)
"""Modules whose forward depends on train/eval mode."""


class InvariantWatch:
    """Attach to a model and its optimizer; `violations(total_steps)` after training."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer
        self.stale: list[float] = []
        self._checked: set[int] = set()
        self._stale_now = 0.0
        self.lrs: list[float] = []
        self.train_modes: dict[str, bool] = {}
        self.eval_modes: dict[str, bool] = {}
        self.no_grad_at_step: set[str] = set()
        self.missing_from_optimizer: list[str] = []
        counts = [(p.numel(), p.requires_grad) for p in model.parameters()]
        self.frozen = invariants.mostly_frozen(
            sum(n for n, trainable in counts if trainable), sum(n for n, _ in counts)
        )
        self._first_step = True
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.register_hook(self._before_accumulation(parameter))
        model.register_forward_pre_hook(self._forward)
        optimizer.register_step_pre_hook(self._before_step)
        optimizer.register_step_post_hook(self._after_step)

    def _before_accumulation(self, parameter: nn.Parameter):
        def hook(grad: torch.Tensor) -> None:
            if id(parameter) not in self._checked:  # the first backward since the last step
                self._checked.add(id(parameter))
                if parameter.grad is not None:
                    self._stale_now += float(parameter.grad.detach().float().pow(2).sum())

        return hook

    def _forward(self, module: nn.Module, args) -> None:
        modes = {
            name: m.training for name, m in module.named_modules() if isinstance(m, MODE_MODULES)
        }
        target = self.train_modes if torch.is_grad_enabled() else self.eval_modes
        for name, training in modes.items():  # the worst seen: any eval at train, train at eval
            if torch.is_grad_enabled():
                target[name] = target.get(name, True) and training
            else:
                target[name] = target.get(name, False) or training

    def _before_step(self, optimizer, args, kwargs) -> None:
        named = dict(self.model.named_parameters())
        trainable = [n for n, p in named.items() if p.requires_grad]
        self.no_grad_at_step |= {n for n in trainable if named[n].grad is None}
        if self._first_step:
            held = {id(p) for group in optimizer.param_groups for p in group["params"]}
            self.missing_from_optimizer = [n for n in trainable if id(named[n]) not in held]
            self._first_step = False

    def _after_step(self, optimizer, args, kwargs) -> None:
        self.stale.append(math.sqrt(self._stale_now))
        self._stale_now, self._checked = 0.0, set()
        self.lrs.append(float(optimizer.param_groups[0]["lr"]))

    def violations(self, total_steps: int) -> dict[str, list[invariants.Violation]]:
        """Every invariant's violations over the run so far, by invariant."""
        named = [n for n, p in self.model.named_parameters() if p.requires_grad]
        found = {
            "train_mode_while_training": invariants.modules_not_training(self.train_modes),
            "eval_mode_while_evaluating": invariants.modules_training_at_eval(self.eval_modes),
            "grads_reset_between_steps": invariants.stale_gradients(self.stale),
            "every_trainable_param_gets_a_gradient": invariants.params_without_gradient(
                named, [n for n in named if n not in self.no_grad_at_step]
            ),
            "every_trainable_param_is_optimized": invariants.params_not_in_optimizer(
                named, [n for n in named if n not in self.missing_from_optimizer]
            ),
            "lr_schedule_collapse": invariants.schedule_collapse(self.lrs, total_steps),
            "params_frozen": self.frozen,
        }
        return found
