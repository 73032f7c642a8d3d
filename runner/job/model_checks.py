"""Two facts of a language model's evaluation forward, read once on the probe's held-out batch
for hyprun.diag.invariants (eval_not_repeatable, future_visible):

- repeatable: in eval mode the same batch at the same weights gives the same loss;
- causal: the output at a position does not move when only later input ids change.

Four forwards per run, in eval mode without autograd, inside a forked RNG: the training that
follows draws the same random numbers as without them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def repeat_gap(model: nn.Module, loss: Callable[[], Any]) -> float:
    """|a - b| / |a| of two eval-mode losses of the same batch at the same weights."""
    with _evaluating(model):
        first, second = float(loss()), float(loss())
    return abs(first - second) / max(abs(first), 1e-12)


def future_influence(model: nn.Module, batch: Any, loss: Callable[[Any], Any]) -> float | None:
    """How far the model's per-position output over the first quarter of the positions moves
    when the ids of the second half change (rolled across rows), over the largest of those
    outputs. The quarter leaves room for a loss that feeds the model its ids shifted by one
    (`tokens[:, :-1]`). None: the batch holds no (rows, positions) ids, or no module returned
    an output per row and position."""
    ids = _ids(batch)
    if ids is None or ids.shape[1] < 8:
        return None
    changed = ids.clone()
    half = ids.shape[1] // 2
    source = ids.roll(1, 0) if ids.shape[0] > 1 else ids.flip(1)
    changed[:, half:] = source[:, half:]
    if torch.equal(changed, ids):
        return None
    with _evaluating(model):
        before = _last_output(model, lambda: loss(batch), ids.shape)
        after = _last_output(model, lambda: loss(_replaced(batch, ids, changed)), ids.shape)
    if before is None or after is None or before.shape != after.shape:
        return None
    quarter = ids.shape[1] // 4
    early, moved = before[:, :quarter].float(), after[:, :quarter].float()
    return float((early - moved).abs().max() / early.abs().max().clamp_min(1e-12))


class _evaluating:
    """Eval mode, no autograd and a forked RNG for the duration; the mode is put back."""

    def __init__(self, model: nn.Module):
        self.model, self.training = model, model.training
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.fork = torch.random.fork_rng(devices=range(torch.cuda.device_count()) if cuda else [])
        self.grad = torch.no_grad()

    def __enter__(self):
        self.fork.__enter__()
        self.grad.__enter__()
        self.model.eval()

    def __exit__(self, *exc):
        self.model.train(self.training)
        self.grad.__exit__(*exc)
        self.fork.__exit__(*exc)


def _last_output(model: nn.Module, forward: Callable[[], Any], ids_shape) -> torch.Tensor | None:
    """The last tensor any module of `model` returned with one row per batch row and at least
    half the positions (the head's logits, the model's own output), under a fixed seed so a
    forward that still draws dropout draws the same masks both times."""
    rows, width = ids_shape
    seen: list[torch.Tensor] = []

    def keep(module, inputs, output) -> None:
        per_position = torch.is_tensor(output) and output.is_floating_point()
        per_position = per_position and output.dim() == 3 and output.shape[0] == rows
        if per_position and output.shape[1] >= width // 2:
            seen.append(output.detach())

    handles = [m.register_forward_hook(keep) for m in model.modules()]
    try:
        torch.manual_seed(0)
        forward()
    finally:
        for handle in handles:
            handle.remove()
    return seen[-1] if seen else None


def _ids(batch: Any) -> torch.Tensor | None:
    """The batch's input ids: `input_ids`, else its first integer (rows, positions) tensor."""
    if isinstance(batch, dict):
        candidates = [batch["input_ids"]] if "input_ids" in batch else list(batch.values())
    elif isinstance(batch, list | tuple):
        candidates = list(batch)
    else:
        candidates = [batch]
    for value in candidates:
        if torch.is_tensor(value) and not value.is_floating_point() and value.dim() == 2:
            return value
    return None


def _replaced(batch: Any, old: torch.Tensor, new: torch.Tensor) -> Any:
    """The batch with the tensor `old` (by identity) swapped for `new`, same container types."""
    if batch is old:
        return new
    if isinstance(batch, dict):
        return type(batch)({k: _replaced(v, old, new) for k, v in batch.items()})
    if isinstance(batch, list | tuple):
        items = [_replaced(v, old, new) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch
