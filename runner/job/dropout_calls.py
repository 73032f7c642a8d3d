"""The dropout a training forward applies, read call by call.

A dropout written wrong rarely shows in the module tree: `F.dropout(dx, p)` called out of place
and its result never assigned leaves the sublayer undropped, and `x = self.drop(x)` written twice
drops the same tensor at 1 - (1 - p)^2. Both show in the calls themselves. One train-mode
forward of the held-out batch runs under a torch function mode that records each functional
dropout call (nn.Dropout calls F.dropout, so modules are seen too) with its input and output,
with autograd on so the loss's graph can be walked afterwards:

- discarded: a call's output has a gradient node that the loss's graph never reaches, so no
  term of the loss depends on the dropped tensor (the undropped input went on in its place);
- stacked: a call's input is another call's output, the same tensor dropped twice.

Exact facts of the graph, no cut. A call with p = 0 or training=False drops nothing and is not
judged. No backward runs and no gradient is written; the RNG is forked, so the training that
follows draws the same masks as without this read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

DROPOUTS = {
    F.dropout: ("input", "p", "training", "inplace"),
    F.dropout1d: ("input", "p", "training", "inplace"),
    F.dropout2d: ("input", "p", "training", "inplace"),
    F.dropout3d: ("input", "p", "training", "inplace"),
    F.alpha_dropout: ("input", "p", "training", "inplace"),
    torch.dropout: ("input", "p", "train"),
}
"""The dropout functions and their parameters in order (their defaults: p 0.5, training on)."""


@dataclass
class DropoutCalls:
    """What one training forward's dropout calls did."""

    applied: int = 0
    """Calls that dropped something (p > 0 in training)."""
    discarded: list[str] = field(default_factory=list)
    """Where a call's output never reached the loss (the module that made the call)."""
    stacked: list[str] = field(default_factory=list)
    """Where a call dropped the output of another call."""


@dataclass
class _Call:
    where: str
    output: torch.Tensor
    judged: bool
    """Whether its output could reach the loss's graph (it has a gradient node of its own)."""


class _Recorder(TorchFunctionMode):
    """Records each dropout call that drops something, in the module that made it."""

    def __init__(self, modules: list[str]):
        super().__init__()
        self.modules = modules
        self.calls: list[_Call] = []
        self.stacked: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func in DROPOUTS:
            self._record(dict(zip(DROPOUTS[func], args, strict=False)) | kwargs, result)
        return result

    def _record(self, bound: dict[str, Any], output: Any) -> None:
        source = bound.get("input")
        drops = float(bound.get("p", 0.5)) > 0 and bool(
            bound.get("training", bound.get("train", True))
        )
        if not drops or not torch.is_tensor(output) or output is source:
            return  # in place: the dropped tensor is the input, read on where it was
        where = self.modules[-1] if self.modules else "the model"
        if any(call.output is source for call in self.calls):
            self.stacked.append(where)
        self.calls.append(_Call(where, output, judged=output.grad_fn is not None))


def dropout_calls(model: nn.Module, loss: Callable[[], Any]) -> DropoutCalls | None:
    """The dropout calls of one train-mode forward of `loss()` (see the module's docstring).
    None: the loss has no gradient graph to walk (no trainable input reached it)."""
    names: list[str] = []
    handles = _module_names(model, names)
    recorder = _Recorder(names)
    training = model.training
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            model.train()
            torch.manual_seed(0)
            with recorder:
                value = loss()
    finally:
        model.train(training)
        for handle in handles:
            handle.remove()
    if not torch.is_tensor(value) or value.grad_fn is None:
        return None
    reached = _graph_nodes(value.grad_fn)
    discarded = [
        call.where for call in recorder.calls if call.judged and call.output.grad_fn not in reached
    ]
    return DropoutCalls(len(recorder.calls), discarded, recorder.stacked)


def _module_names(model: nn.Module, names: list[str]) -> list:
    """Hooks that keep `names` a stack of the modules whose forward is running."""
    handles = []
    for name, module in model.named_modules():
        label = name or type(model).__name__

        def enter(_module, _args, label=label) -> None:
            names.append(label)

        def leave(_module, _args, _output) -> None:
            names.pop()

        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave, always_call=True))
    return handles


def _graph_nodes(root) -> set:
    """Every gradient node the loss's graph reaches from `root`."""
    seen, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(parent for parent, _ in node.next_functions)
    return seen
