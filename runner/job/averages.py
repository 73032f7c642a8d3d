"""A weight average the loop keeps beside the model (an EMA: torch's AveragedModel, a deepcopy
of the model, a dict of shadow tensors), found and read by the probe.

An EMA moves toward the trained weights by a fixed share each optimizer step:
shadow <- decay * shadow + (1 - decay) * weights. Two reads hold it to that without knowing the
decay the user meant:
- how often it changes per optimizer step (read at each backward and each step): an average of
  the weights changes only when they do, so more than once a step is an update per micro-batch;
- the decay one step applied: the shadow after the step's update against the shadow and the
  weights before it. Above 1 the shadow moves away from the weights (the update's sign flipped);
  below a half it keeps less of itself than of the weights (the decay given as the new weights'
  share). A copy loaded from the weights reads 0 and one left alone 1: neither is an EMA, and
  neither is judged.
"""

from __future__ import annotations

import gc
import statistics
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from torch import nn

LERP_FIT = 0.1
"""Largest relative residual of a step's change of the copy off the line from its old value to
the weights: a linear update (any decay, any sign) fits to rounding; a copy replaced by another
snapshot does not and is not read as a decay."""
SAMPLE_ELEMENTS = 1 << 22
"""Elements of the copy (and as many of the weights) a decay read holds for one step."""
COPY = 1e-3
"""Decays at or below this read as a copy of the weights, not an average."""


@dataclass
class Average:
    """One copy of the trainable weights the loop keeps, its tensors in the model's order."""

    name: str
    tensors: list[torch.Tensor]
    last: float | None = None
    """The checksum at the last read."""
    changes: int = 0
    """Changes seen since the last optimizer step."""
    per_step: list[int] = field(default_factory=list)
    """Changes per optimizer step, for the steps it changed in."""
    decays: list[float] = field(default_factory=list)
    """Effective decays read over single steps."""

    def checksum(self) -> float:
        return float(self.tensors[0].detach().double().sum())


FIND_LIMIT = 16
"""Most copies kept for reading: a process may hold stale copies of the same shapes (an earlier
run's model, a reference snapshot) that never change and are never judged; past three of them
the loop's own EMA went unread in a process that trained several models (a checksum each per
backward is the whole cost)."""


def find_averages(model: nn.Module, limit: int = FIND_LIMIT) -> list[Average]:
    """Live copies of `model`'s trainable weights that are not its own tensors: modules whose
    parameters have the model's shapes in its order (a deepcopy, AveragedModel), and dicts
    of tensors keyed by the trainable weights' names (a shadow dict). A scan of the live objects,
    as nothing links a model to its average (read once, after the first steps)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        return []
    shapes = [tuple(p.shape) for _, p in named]
    every = [tuple(p.shape) for p in model.parameters()]
    storage = {p.data_ptr() for p in model.parameters()}
    found: list[Average] = []
    gc.collect()  # copies the loop dropped are not its average
    for candidate in gc.get_objects():
        tensors = _copy_tensors(candidate, model, named, every, shapes)
        if tensors and not any(t.data_ptr() in storage for t in tensors):
            found.append(Average(_describe(candidate, len(tensors)), tensors))
            if len(found) >= limit:
                break
    return found


def _copy_tensors(candidate, model, named, every, shapes) -> list[torch.Tensor] | None:
    if isinstance(candidate, nn.Module) and candidate is not model:
        params = list(candidate.parameters())
        if [tuple(p.shape) for p in params] != every:
            return None
        trainable = {id(p) for _, p in named}
        pairs = zip(params, model.parameters(), strict=True)
        return [copy for copy, own in pairs if id(own) in trainable]
    # plain dicts only: a library's dict subclass may redefine get() (transformers' lazy maps)
    if type(candidate) in (dict, OrderedDict) and len(candidate) == len(named):
        values = [candidate.get(name) for name, _ in named]
        if all(torch.is_tensor(v) for v in values) and [tuple(v.shape) for v in values] == shapes:
            return values
    return None


def _describe(candidate, count: int) -> str:
    if isinstance(candidate, nn.Module):
        return f"a {type(candidate).__name__} copy of the model"
    return f"a dict of {count} shadow tensors"


def effective_decay(
    before: list[torch.Tensor], weights: list[torch.Tensor], after: list[torch.Tensor]
) -> float | None:
    """The decay d with after - weights = d * (before - weights), fitted over every element (in
    float64); None where the copy did not change, sat on the weights, or did not move along
    that line (LERP_FIT)."""
    gap = _flat_gap(before, weights)
    moved = _flat_gap(after, weights)
    spread = float(gap.dot(gap))
    if spread == 0 or torch.equal(moved, gap):
        return None
    decay = float(moved.dot(gap)) / spread
    residual = float((moved - decay * gap).norm()) / max(float(moved.norm()), 1e-30)
    return decay if residual <= LERP_FIT else None


def _flat_gap(copy: list[torch.Tensor], weights: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(
        [(c.double() - w.double()).flatten() for c, w in zip(copy, weights, strict=True)]
    )


class AverageReader:
    """The probe's reads of the averages it found: a checksum at each backward and each step,
    and one step's decay at each probed step (the copy and the weights held for one step)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.averages: list[Average] | None = None
        self._held: list[tuple[Average, list[torch.Tensor], list[torch.Tensor]]] = []

    def find(self) -> None:
        self.averages = find_averages(self.model)

    def backward(self) -> None:
        for average in self.averages or []:
            self._count(average)

    def step(self, probed: bool) -> None:
        """After an optimizer step: close the step's count, finish a held decay read, and hold
        the copy and the weights now when the step is probed."""
        for average in self.averages or []:
            self._count(average)
            if average.changes:
                average.per_step.append(average.changes)
            average.changes = 0
        for average, before, weights in self._held:
            decay = effective_decay(before, weights, average.tensors[: len(before)])
            if decay is not None and decay > COPY:
                average.decays.append(decay)
        self._held = []
        if probed:
            weights = [p for p in self.model.parameters() if p.requires_grad]
            count = _sample_size(weights)
            self._held = [
                (a, _clones(a.tensors[:count]), _clones(weights[:count]))
                for a in self.averages or []
            ]

    def _count(self, average: Average) -> None:
        now = average.checksum()
        if average.last is not None and now != average.last:
            average.changes += 1
        average.last = now

    def reads(self) -> list[tuple[str, float | None, float | None]]:
        """Per average: (what it is, its median updates per step it changed in, its median
        effective decay), either None where not read."""
        return [
            (
                a.name,
                statistics.median(a.per_step) if a.per_step else None,
                statistics.median(a.decays) if a.decays else None,
            )
            for a in self.averages or []
        ]


def _sample_size(tensors: list[torch.Tensor]) -> int:
    """How many of the first tensors a decay read holds: up to SAMPLE_ELEMENTS (at least one),
    so two copies of a large model are never held; a linear update fits on any subset."""
    total = 0
    for count, tensor in enumerate(tensors, start=1):
        total += tensor.numel()
        if total >= SAMPLE_ELEMENTS:
            return count
    return len(tensors)


def _clones(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone() for t in tensors]
