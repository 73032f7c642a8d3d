"""diag/invariants.py on any torch model and optimizer, through the hooks the probe uses
(runner/job/invariant_hooks.py), for the bench's false-alarm rates: one implementation, the
probe's. Torch hooks only; the loop is not changed."""

from __future__ import annotations

import torch
from torch import nn

from hyprun.diag import invariants
from hyprun.runner.job.invariant_hooks import InvariantHooks


class InvariantWatch:
    """Attach to a model and its optimizer; `violations(total_steps)` after training. Every
    step's first backward is read for left-over gradients (the probe reads a fixed few)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer
        self.hooks = InvariantHooks(model, checked_steps=lambda step: True)
        self.no_grad_at_step: set[str] = set()
        self.missing_from_optimizer: list[str] = []
        self._first_step = True
        optimizer.register_step_pre_hook(self._before_step)
        optimizer.register_step_post_hook(lambda optimizer, *_: self.hooks.stepped(optimizer))

    def _before_step(self, optimizer, args, kwargs) -> None:
        self.hooks.loss_read_done()
        named = dict(self.model.named_parameters())
        trainable = [n for n, p in named.items() if p.requires_grad]
        self.no_grad_at_step |= {n for n in trainable if named[n].grad is None}
        if self._first_step:
            held = {id(p) for group in optimizer.param_groups for p in group["params"]}
            self.missing_from_optimizer = [n for n in trainable if id(named[n]) not in held]
            self._first_step = False

    def violations(self, total_steps: int) -> dict[str, list[invariants.Violation]]:
        """Every invariant's violations over the run so far, by invariant."""
        named = [n for n, p in self.model.named_parameters() if p.requires_grad]
        hooks = self.hooks
        return {
            "train_mode_while_training": invariants.modules_not_training(
                dict.fromkeys(sorted(hooks.eval_at_train), False)
            ),
            "eval_mode_while_evaluating": invariants.modules_training_at_eval(
                dict.fromkeys(sorted(hooks.train_at_eval), True)
            ),
            "grads_reset_between_steps": invariants.stale_gradients(hooks.stale),
            "every_trainable_param_gets_a_gradient": invariants.params_without_gradient(
                named, [n for n in named if n not in self.no_grad_at_step]
            ),
            "every_trainable_param_is_optimized": invariants.params_not_in_optimizer(
                named, [n for n in named if n not in self.missing_from_optimizer]
            ),
            "lr_schedule_collapse": invariants.schedule_collapse(hooks.lrs, total_steps),
            "params_frozen": invariants.mostly_frozen(
                hooks.trainable_elements, hooks.total_elements
            ),
        }
