"""How a model's attention forms its scores and weights, read on one eval forward of the probe's
held-out batch (the model as initialised) for hyprun.diag.invariants:

- scaled: q.k reaches the softmax divided by about sqrt(head_dim), for q and k of their init's
  sizes (attention_scale_wrong);
- normalised: the weights that mix the values sum to one over the keys
  (attention_rows_unnormalised).

Read through a TorchFunctionMode, so any attention counts, torch's, Hugging Face's or one written
by hand. `F.scaled_dot_product_attention` states its scale (None: 1/sqrt(head_dim)). A
hand-written attention is followed from the matmul that makes a square (.., S, S) matrix of
q and k's transpose, through multiplications by a number, masks and reshapes, to its softmax;
its weights are read where they multiply the values. A number q or k was multiplied by before
that matmul (timm's `q = q * self.scale`, torch's own `q * sqrt(1 / E)`) counts as the scale.

Not read: nn.MultiheadAttention (its forward is one call to the mode), scores formed by einsum,
and cosine attention (q and k normalised to unit length,
then multiplied by a learned temperature), which has no head_dim scale to keep.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

ROW_TOL = 1e-2
"""How far a row of attention weights may sum from one (bf16 rounding stays well inside)."""

SCALE_NAMES = {"__mul__", "__rmul__", "__imul__", "mul", "mul_"}
DIVIDE_NAMES = {"__truediv__", "__itruediv__", "div", "div_"}
MATMUL_NAMES = {"matmul", "__matmul__", "bmm"}
PASS_NAMES = {
    "transpose",
    "permute",
    "view",
    "reshape",
    "contiguous",
    "unflatten",
    "flatten",
    "chunk",
    "split",
    "unbind",
    "__getitem__",
    "masked_fill",
    "masked_fill_",
    "to",
    "float",
    "half",
    "bfloat16",
    "type_as",
    "clone",
    "expand",
    "squeeze",
    "unsqueeze",
    "view_as",
    "reshape_as",
    "__add__",
    "__radd__",
    "__iadd__",
    "add",
    "add_",
    "__sub__",
    "sub",
    "where",
    "dropout",
    "nan_to_num",
    "tril",
    "triu",
}
"""Ops that carry a tensor's scale (and what it is: scores, weights) to their outputs: reshapes,
dtype casts, masks added or filled in, dropout (off in eval mode)."""


@dataclass
class AttentionReads:
    """What one eval forward's attention showed."""

    scales: list[float] = field(default_factory=list)
    """Per attention: the scale applied to q.k times sqrt(head_dim), times the RMS of q over that
    of k (_balance): 1 for the usual scaling."""
    unnormalised: list[float] = field(default_factory=list)
    """Per product of softmax weights with the values: the share of its rows (queries) whose
    weights do not sum to one over the keys (NaN rows count)."""


@dataclass
class _Traced:
    """A tensor of this forward that carries a scale: q or k multiplied by a number (head_dim
    None), attention scores (head_dim of the q.k product), or softmax weights."""

    tensor: weakref.ref
    scale: float = 1.0
    head_dim: int | None = None
    weights: bool = False


class _AttentionMode(torch.overrides.TorchFunctionMode):
    """Follows scales from q and k to the softmax, and softmax weights to the values."""

    def __init__(self):
        super().__init__()
        self.reads = AttentionReads()
        self.traced: dict[int, _Traced] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if func is F.scaled_dot_product_attention:
            self._sdpa(args, kwargs)
        elif name in MATMUL_NAMES and len(args) >= 2:
            self._matmul(args[0], args[1], out)
        elif name == "baddbmm" and len(args) >= 3:
            self._matmul(args[1], args[2], out, float(kwargs.get("alpha", 1.0)))
        elif name == "softmax":
            self._softmax(args[0] if args else kwargs.get("input"), out)
        elif name in SCALE_NAMES | DIVIDE_NAMES:
            self._scaled(name, args, out)
        elif name in PASS_NAMES:
            self._passed(args, kwargs, out)
        return out

    def find(self, value: Any) -> _Traced | None:
        if not torch.is_tensor(value):
            return None
        traced = self.traced.get(id(value))
        return traced if traced is not None and traced.tensor() is value else None

    def keep(self, out: Any, like: _Traced, **changes) -> None:
        for tensor in out if isinstance(out, list | tuple) else [out]:
            if torch.is_tensor(tensor):
                fields = {**like.__dict__, **changes, "tensor": weakref.ref(tensor)}
                self.traced[id(tensor)] = _Traced(**fields)

    def _sdpa(self, args, kwargs) -> None:
        query, key = args[0], args[1]
        scale = kwargs.get("scale", args[6] if len(args) > 6 else None)
        head_dim = query.shape[-1]
        scale = head_dim**-0.5 if scale is None else float(scale)
        if not _unit_rows(query) and (balance := self._balance(query, key)) is not None:
            scale *= self._scale_of(query) * self._scale_of(key)
            self.reads.scales.append(scale * head_dim**0.5 * balance)

    def _matmul(self, left, right, out, alpha: float = 1.0) -> None:
        if not (torch.is_tensor(left) and torch.is_tensor(right) and torch.is_tensor(out)):
            return
        weights = self.find(left)
        if weights is not None and weights.weights:
            self.reads.unnormalised.append(_rows_off(left))
        elif _square(out) and left.dim() >= 2 and not _unit_rows(left):
            balance = self._balance(left, right)
            if balance is not None:
                scale = alpha * self._scale_of(left) * self._scale_of(right) * balance
                self.keep(out, _Traced(weakref.ref(out), scale, head_dim=left.shape[-1]))

    def _softmax(self, scores, out) -> None:
        """Softmax weights from square scores, or from traced q.k scores in any shape (a
        softmax over heads x keys reads scores reshaped to one row per query)."""
        if not torch.is_tensor(scores):
            return
        traced = self.find(scores)
        if not _square(scores) and (traced is None or not traced.head_dim):
            return
        if traced is not None and traced.head_dim:
            self.reads.scales.append(traced.scale * traced.head_dim**0.5)
        self.keep(out, _Traced(weakref.ref(out), weights=True))

    def _scaled(self, name: str, args, out) -> None:
        if len(args) < 2 or not torch.is_tensor(out):
            return
        tensor, number = (args[0], args[1]) if torch.is_tensor(args[0]) else (args[1], args[0])
        factor = _number(number)
        if factor is None or factor == 0 or not torch.is_tensor(tensor):
            return
        traced = self.find(tensor) or _Traced(weakref.ref(tensor))
        factor = 1 / factor if name in DIVIDE_NAMES else factor
        self.keep(out, traced, scale=traced.scale * factor)

    def _passed(self, args, kwargs, out) -> None:
        found = [self.find(t) for t in (*args, *kwargs.values()) if self.find(t) is not None]
        attention = [t for t in found if t.head_dim or t.weights]  # scores + a scaled mask
        if len(attention) == 1 or len(found) == 1:
            self.keep(out, (attention or found)[0])

    def _balance(self, query, key) -> float | None:
        """The RMS of q over that of k, each before the numbers it was multiplied by. A model
        that leaves q.k unscaled by design scales q's init down by sqrt(head_dim) instead (T5):
        the scores the softmax reads are then those of a scaled attention. None: k is zero."""
        query_rms, key_rms = (
            float(t.detach().float().pow(2).mean().sqrt()) / abs(self._scale_of(t))
            for t in (query, key)
        )
        return query_rms / key_rms if key_rms > 0 else None

    def _scale_of(self, tensor) -> float:
        traced = self.find(tensor)
        return traced.scale if traced is not None else 1.0


def attention_reads(model: torch.nn.Module, loss: Callable[[], Any]) -> AttentionReads | None:
    """One forward of `loss` (the caller puts the model in eval mode, without autograd) read by
    _AttentionMode. None: no attention was read."""
    mode = _AttentionMode()
    with mode:
        loss()
    reads = mode.reads
    return reads if reads.scales or reads.unnormalised else None


def _square(tensor: torch.Tensor) -> bool:
    """A (.., S, S) matrix of two or more positions: scores or weights of an attention."""
    return tensor.dim() >= 2 and tensor.shape[-1] == tensor.shape[-2] >= 2


def _unit_rows(tensor: torch.Tensor) -> bool:
    """Rows normalised to unit length (cosine attention): no head_dim scale applies."""
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return False
    norms = tensor.detach().float().norm(dim=-1)
    return bool((norms - 1).abs().max() < 1e-3)


def _rows_off(weights: torch.Tensor) -> float:
    """The share of the weights' rows whose sum over the keys is not one (or NaN)."""
    sums = weights.detach().float().sum(dim=-1)
    off = ~((sums - 1).abs() <= ROW_TOL)
    return float(off.float().mean())


def _number(value: Any) -> float | None:
    """A Python number or a one-element tensor as a float; None for anything else."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if torch.is_tensor(value) and value.numel() == 1 and value.dim() == 0:
        number = float(value)
        return number if math.isfinite(number) else None
    return None
