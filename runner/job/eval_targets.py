"""The targets an evaluation's loss counts, against those the training loss counts.

An evaluation scores the model on the task it trains on, so an id its loss counts as a target in
many rows is one the training loss counts too. A held-out mask built from the inputs' padding
mask instead of the shifted labels' (SkyworkAI/Skywork#55) counts the pad after each row's last
real token: a target training never has, so the reported loss is not the loss on the held-out
text. The first EVAL_FORWARDS evaluation forwards (without gradients, outside the probe's own)
are read under a torch function mode that records, per row, the ids each F.cross_entropy call
counts; training's are read from the probe's first steps (invariant_hooks.LossInputs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

EVAL_FORWARDS = 4
"""Evaluation forwards whose loss targets are read (an evaluation's first batches show how
its loss is masked; every batch of it is masked alike)."""


class EvalTargets(TorchFunctionMode):
    """While active, counts the rows in which each id is a counted cross-entropy target."""

    def __init__(self, skip: Callable[[], bool]):
        super().__init__()
        self.skip = skip
        """Whether a call is the probe's own (its held-out reads), not the evaluation's."""
        self.rows: int | None = None
        """The current evaluation forward's input rows, to split a flattened target by row."""
        self.by_id: Counter = Counter()
        """By id, the evaluation rows in which the loss counted it as a target."""
        self.rows_read = 0
        self.forwards = 0
        """Evaluation forwards read so far (at most EVAL_FORWARDS)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is F.cross_entropy and not self.skip():
            target = args[1] if len(args) > 1 else kwargs.get("target")
            if torch.is_tensor(target) and not target.is_floating_point() and target.dim() >= 1:
                self.read(target.detach(), int(kwargs.get("ignore_index", -100)))
        return out

    def read(self, target: torch.Tensor, ignore: int) -> None:
        rows = target.shape[0] if target.dim() >= 2 else self.rows
        if not rows or target.numel() % rows:
            return
        for row in target.reshape(rows, -1).cpu():
            self.by_id.update(set(row[row != ignore].tolist()))
        self.rows_read += rows

    def unseen(self, trained: set[int]) -> tuple[int, int, int] | None:
        """(the id counted in the most evaluation rows that training never counted, those
        rows, the rows read); None: nothing read on either side."""
        if not self.rows_read or not trained:
            return None
        never = {token: rows for token, rows in self.by_id.items() if token not in trained}
        token = max(never, key=never.get, default=-1)
        return token, never.get(token, 0), self.rows_read
