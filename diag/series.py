"""Pure statistics over one metric history: trend within noise, oscillation, robust summaries.

A history is a list of (step, value) with step = tokens seen. Non-finite values are dropped
before any statistic (divergence is reported separately, from the tags and the raw loss), and
every function answers None or "insufficient" rather than guessing from a handful of points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_POINTS = 8
"""Fewer points than this and a trend or a spread is not measured: it would be a guess."""

Points = Sequence[tuple[int, float]]


def arrays(points: Points) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) as float arrays, sorted by step, non-finite values dropped."""
    if not points:
        return np.zeros(0), np.zeros(0)
    data = np.asarray(sorted(points, key=lambda p: p[0]), dtype=float).reshape(-1, 2)
    keep = np.isfinite(data[:, 1])
    return data[keep, 0], data[keep, 1]


def count_nonfinite(points: Points) -> int:
    """How many values are NaN or infinite."""
    return sum(1 for _, v in points if not math.isfinite(v))


def tail(points: Points, frac: float = 0.2, min_points: int = MIN_POINTS) -> Points:
    """The finite points in the last `frac` of the token span, widened to the last `min_points`
    points when that span holds fewer (a sparse metric still gets a tail)."""
    steps, vals = arrays(points)
    if steps.size == 0:
        return []
    start = steps[-1] - frac * (steps[-1] - steps[0])
    chosen = steps >= start
    if chosen.sum() < min_points:
        chosen = np.zeros_like(chosen)
        chosen[-min_points:] = True
    return [(int(s), float(v)) for s, v in zip(steps[chosen], vals[chosen], strict=True)]


def median(points: Points) -> float | None:
    """Median of the finite values, None when there are none."""
    _, vals = arrays(points)
    return float(np.median(vals)) if vals.size else None


def tail_median(points: Points, frac: float = 0.2) -> float | None:
    """Median of the last `frac` of the token span: the level a metric settled at, robust to one
    odd point (uses at least the last 3 points)."""
    return median(tail(points, frac, min_points=3))


def first(points: Points) -> float | None:
    """The first finite value."""
    _, vals = arrays(points)
    return float(vals[0]) if vals.size else None


def last(points: Points) -> float | None:
    """The last finite value."""
    _, vals = arrays(points)
    return float(vals[-1]) if vals.size else None


def nearest(points: Points, step: float, count: int = 1) -> Points:
    """The `count` points logged nearest `step` (ties: the earlier first)."""
    return sorted(points, key=lambda point: abs(point[0] - step))[:count]


def last_over_first(points: Points, frac: float = 0.1) -> float | None:
    """Tail median over the first value: growth (>1) or shrinkage (<1) across the run. None when
    the first value is 0 or there are fewer than 2 points."""
    _, vals = arrays(points)
    if vals.size < 2 or vals[0] == 0:
        return None
    end = tail_median(points, frac)
    return None if end is None else float(end / vals[0])


def max_after(points: Points, skip_frac: float = 0.1) -> float | None:
    """Largest finite value after the first `skip_frac` of the token span: the start of training
    is a transient (large gradients at init), not an explosion."""
    steps, vals = arrays(points)
    if vals.size == 0:
        return None
    start = steps[0] + skip_frac * (steps[-1] - steps[0])
    after = vals[steps >= start]
    return float(after.max()) if after.size else float(vals[-1])


@dataclass
class Trend:
    """A straight-line fit to the tail of a curve, and whether its slope is within noise."""

    kind: str
    """plateau (slope within `z` standard errors of 0) | descending | rising | insufficient."""
    n: int
    """Points in the fitted tail."""
    slope: float | None = None
    """Change per token over the tail (OLS)."""
    stderr: float | None = None
    """Standard error of the slope, inflated for autocorrelated residuals."""
    noise: float | None = None
    """Residual standard deviation around the fitted line."""
    level: float | None = None
    """Median value over the tail."""
    span: float | None = None
    """Tokens covered by the tail."""
    autocorr: float | None = None
    """Lag-1 autocorrelation of the residuals (a window-mean loss is smooth, so neighbours are
    not independent and the naive standard error would call every wiggle a trend)."""

    @property
    def t(self) -> float | None:
        """Slope in standard errors."""
        if self.slope is None or self.stderr is None:
            return None
        if self.stderr == 0:
            return 0.0 if self.slope == 0 else math.copysign(math.inf, self.slope)
        return self.slope / self.stderr

    @property
    def rel_change(self) -> float | None:
        """Change over the tail as a fraction of its level."""
        if self.slope is None or self.span is None or not self.level:
            return None
        return self.slope * self.span / abs(self.level)

    def describe(self, what: str = "slope") -> str:
        """One line with the numbers, for a finding's detail."""
        if self.kind == "insufficient":
            return f"{what}: insufficient data ({self.n} points, need {MIN_POINTS})"
        return (
            f"{what}: {self.slope:.3g} ± {self.stderr:.2g} per token over the last "
            f"{self.span:.3g} tokens ({self.n} points, t = {self.t:.2g}, noise {self.noise:.3g})"
            f" -> {self.kind}"
        )


def trend(
    points: Points, tail_frac: float = 0.2, z: float = 2.0, min_points: int = MIN_POINTS
) -> Trend:
    """Fit a line to the last `tail_frac` of the tokens and classify its slope: within `z`
    standard errors of zero is a plateau ("within noise"), significantly negative is still
    descending (train longer), significantly positive is rising."""
    pts = tail(points, tail_frac, min_points)
    if len(pts) < min_points:
        return Trend(kind="insufficient", n=len(pts))
    x = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    xc = x - x.mean()
    sxx = float((xc**2).sum())
    level = float(np.median(y))
    span = float(x[-1] - x[0])
    if sxx == 0:
        return Trend(kind="insufficient", n=len(pts), level=level, span=span)
    slope = float((xc * (y - y.mean())).sum() / sxx)
    resid = y - y.mean() - slope * xc
    dof = len(pts) - 2
    noise = float(math.sqrt(float((resid**2).sum()) / dof))
    r1 = 0.0
    denom = float((resid**2).sum())
    if denom > 0:
        r1 = float((resid[1:] * resid[:-1]).sum() / denom)
    inflate = math.sqrt((1 + min(r1, 0.9)) / (1 - min(r1, 0.9))) if r1 > 0 else 1.0
    stderr = noise / math.sqrt(sxx) * inflate
    kind = "plateau" if abs(slope) <= z * stderr else ("descending" if slope < 0 else "rising")
    return Trend(
        kind=kind,
        n=len(pts),
        slope=slope,
        stderr=stderr,
        noise=noise,
        level=level,
        span=span,
        autocorr=r1,
    )


def local_noise(points: Points, window: int | None = None) -> float | None:
    """Typical point-to-point scatter: the median over rolling windows of the std of first
    differences, over √2. Differencing removes the slow trend, the median ignores one spike."""
    _, vals = arrays(points)
    if vals.size < MIN_POINTS:
        return None
    diffs = np.diff(vals)
    w = window or max(4, min(32, diffs.size // 8))
    w = min(w, diffs.size)
    windows = np.lib.stride_tricks.sliding_window_view(diffs, w)
    return float(np.median(windows.std(axis=1)) / math.sqrt(2))


def oscillation(points: Points, window: int | None = None) -> float | None:
    """Local scatter relative to the curve's overall scale: its range (5th to 95th percentile),
    or its level when the curve barely moves, so a flat but quiet curve does not count as
    oscillating. ~0.01 for a healthy loss, >0.05 when it swings by a fair part of its value."""
    sigma = local_noise(points, window)
    if sigma is None:
        return None
    _, vals = arrays(points)
    spread = float(np.percentile(vals, 95) - np.percentile(vals, 5))
    scale = max(spread, abs(float(np.median(vals))))
    return 0.0 if scale == 0 else sigma / scale
