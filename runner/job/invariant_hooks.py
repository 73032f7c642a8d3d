"""The torch hooks hyprun.diag.invariants needs, on any model: what they read, at which step.

Attached by the probe (runner/job/probe.py) and the corpus bench's watch. Per step they cost a
read of a few modules' `.training` per forward and one Python call per parameter per backward;
the only pass over gradient values is on the steps `checked` names, and only where a `.grad`
is already there (zero_grad(set_to_none=True), torch's default, leaves None: nothing to read).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

MODE_MODULES = (nn.Dropout, nn.modules.batchnorm._BatchNorm)
"""Modules whose forward depends on train/eval mode."""
LOSS_READ_STEPS = 3
"""Optimizer steps whose first training forward and loss are read for cross-entropy's input
(a bug of the code is there from the first step; every op of those forwards passes through
Python once)."""


class LossInputs(TorchFunctionMode):
    """While active, reads what F.cross_entropy is given: (smallest, largest value, largest
    |sum over the class dimension - 1|) per call, for hyprun.diag.invariants."""

    def __init__(self, reads: list[tuple[float, float, float]]):
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.cross_entropy:
            scores = args[0] if args else kwargs.get("input")
            if torch.is_tensor(scores) and scores.is_floating_point() and scores.numel():
                self.reads.append(class_spread(scores.detach()))
        return func(*args, **kwargs)


def class_spread(scores: torch.Tensor) -> tuple[float, float, float]:
    """(min, max, max |row sum - 1|) of a cross-entropy input; classes are dimension 1 of a
    batch (N, C, ...), dimension 0 of one unbatched (C,) row."""
    values = scores.float()
    sums = values.sum(dim=1 if values.dim() >= 2 else 0)
    return float(values.min()), float(values.max()), float((sums - 1).abs().max())


def mode_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Dropout with p > 0 and batch norm with running statistics: the modules whose output
    changes with the mode (a p=0 dropout is the identity in both)."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if (isinstance(module, nn.Dropout) and module.p > 0)
        or (isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats)
    ]


class InvariantHooks:
    """Attach to a model; call `stepped(step)` after each optimizer step.

    own_forward: set while the caller runs forwards of its own (the probe's step scan) so they
    are not read as the loop's evaluation.
    """

    def __init__(self, model: nn.Module, checked_steps=lambda step: step < 3):
        self.model = model
        self.modules = mode_modules(model)
        self.checked_steps = checked_steps
        """step -> whether the first backward of that step reads the gradients left over."""
        self.own_forward = False
        self.eval_at_train: set[str] = set()
        """Mode modules in eval mode at a forward that an optimizer step then used."""
        self.train_at_eval: set[str] = set()
        """Mode modules in train mode at a forward without gradients (an evaluation)."""
        self.stale: dict[int, float] = {}
        """By checked step: the norm of the gradients already there at its first backward."""
        self.lrs: list[float] = []
        """The LR (group 0) after each optimizer step."""
        self.loss_inputs: list[tuple[float, float, float]] = []
        """What cross-entropy was given in the first LOSS_READ_STEPS steps (LossInputs)."""
        self.stream: list[tuple[int, float, float]] = []
        """(step, its training batch's loss before the update, the held-out loss at the same
        weights), on the steps whose held-out loss the caller read (`heldout_read`)."""
        counts = [(p.numel(), p.requires_grad) for p in model.parameters()]
        self.trainable_elements = sum(n for n, trainable in counts if trainable)
        self.total_elements = sum(n for n, _ in counts)
        self._step = 0
        self._last_train_modes: set[str] = set()
        self._seen: set[int] = set()
        self._stale_sum = 0.0
        self._loss_mode: LossInputs | None = None
        self._handles = [model.register_forward_pre_hook(self._forward)]
        for parameter in model.parameters():
            if parameter.requires_grad:
                self._handles.append(parameter.register_hook(self._before_accumulation(parameter)))

    def _forward(self, module: nn.Module, args) -> None:
        if self.own_forward:
            return
        if self._step < LOSS_READ_STEPS and torch.is_grad_enabled() and self._loss_mode is None:
            self._loss_mode = LossInputs(self.loss_inputs)  # until the backward is done
            self._loss_mode.__enter__()
        if not self.modules:
            return
        if torch.is_grad_enabled():  # the modes a backward, then a step, will train with
            self._last_train_modes = {n for n, m in self.modules if not m.training}
        else:
            self.train_at_eval |= {n for n, m in self.modules if m.training}

    def _before_accumulation(self, parameter: nn.Parameter):
        def hook(grad: torch.Tensor) -> None:
            if not self.checked_steps(self._step) or id(parameter) in self._seen:
                return  # not a checked step, or a later backward of it (accumulation)
            self._seen.add(id(parameter))
            if parameter.grad is not None:
                self._stale_sum += float(parameter.grad.detach().float().pow(2).sum())

        return hook

    def loss_read_done(self) -> None:
        """The step's backward is done: stop reading cross-entropy's input (only if no mode
        entered after ours is still active: modes nest)."""
        stack = _get_current_function_mode_stack()
        if self._loss_mode is not None and stack and stack[-1] is self._loss_mode:
            self._loss_mode.__exit__(None, None, None)
            self._loss_mode = None

    def heldout_read(self, train_loss: float, heldout_loss: float) -> None:
        """The step in progress: its training loss and the held-out loss at the same weights."""
        self.stream.append((self._step, train_loss, heldout_loss))

    def stepped(self, optimizer) -> None:
        """After an optimizer step: commit what this step showed, reset for the next."""
        self.loss_read_done()
        if self._seen:
            self.stale[self._step] = math.sqrt(self._stale_sum)
        self._seen, self._stale_sum = set(), 0.0
        self.eval_at_train |= self._last_train_modes
        groups = getattr(optimizer, "param_groups", None)
        if groups:
            self.lrs.append(float(groups[0]["lr"]))
        self._step += 1

    def remove(self) -> None:
        self.loss_read_done()
        for handle in self._handles:
            handle.remove()
        self._handles = []


def parameter_checksums(parameters: list[nn.Parameter]) -> list[float] | None:
    """Each rank's float64 sum of its parameters (all_gather), or None outside a process group:
    data-parallel replicas hold the same weights after every step."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    if any(hasattr(p, "ds_tensor") for p in parameters):
        return None  # ZeRO-3: each rank holds a different shard by design
    total = sum(p.detach().double().sum() for p in parameters)
    local = torch.as_tensor(total, dtype=torch.float64).reshape(1)
    if torch.distributed.get_backend() == "nccl":
        local = local.cuda()
    gathered = [torch.zeros_like(local) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, local)
    return [float(t.item()) for t in gathered]
