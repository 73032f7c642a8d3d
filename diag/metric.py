"""The one definition of a metric to judge: its MLflow name, which way is better, the smallest
effect that matters. The verdict (diag/verdict.py) reads it; hypothesis cards
(hypotheses/schema.py) are written in it.

A plain frozen dataclass that checks itself on construction, so it is positional in code
(`MetricSpec("eval/loss", "min", 0.01)`) and a pydantic model can hold it as a field (pydantic
validates the annotated types, then the checks below run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

DIRECTIONS = ("min", "max")
"""Whether a metric is better lower (`min`, e.g. eval/loss) or higher (`max`, tokens/s)."""


@dataclass(frozen=True)
class MetricSpec:
    """One metric to compare between the baseline and a hypothesis, and which way is better."""

    metric: str
    """The MLflow key logged by the job (step = tokens seen), e.g. "eval/loss"."""
    direction: Literal["min", "max"]
    """"min" when lower is better, "max" when higher is better."""
    min_effect: float = 0.0
    """For the primary metric: the smallest relative improvement worth acting on (0.01 = 1%),
    so a real but negligible effect is not reported as a win. For a guard: the relative
    regression tolerated beyond seed noise (0 = the verdict table's guard_floor)."""
    window: float | None = None
    """Median window for reading a per-step noisy metric (fraction of the tokens up to the
    mark; 0 = the single value logged there). None: by metric-name prefix from the verdict
    table (perf/* -> 0.25, else 0)."""

    def __post_init__(self) -> None:
        name = f"metric {self.metric!r}"
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"{name}: the MLflow metric name must be a non-empty string")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"{name}: direction must be 'min' or 'max', got {self.direction!r}")
        if not (isinstance(self.min_effect, int | float) and math.isfinite(self.min_effect)):
            raise ValueError(f"{name}: min_effect must be a finite number, got {self.min_effect!r}")
        if self.min_effect < 0:
            raise ValueError(f"{name}: min_effect must be >= 0, got {self.min_effect!r}")
        if self.window is not None and not 0 <= self.window <= 1:
            raise ValueError(f"{name}: window must be within [0, 1], got {self.window!r}")
