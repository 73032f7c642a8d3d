"""Spike detection for loss and gradient norm, online (in the job) and offline (in triage).

A value is a spike when, against the last `window` accepted values, it is either
- above mean + `sigmas` x std (the OLMo-core rule: a jump far outside the recent scatter), or
- above `ratio` x mean (the method's "10x the moving average" rule, which still fires when the
  recent scatter is itself wide).
No value is judged before `min_history` values were accepted. The std has a floor of
`rel_floor` x |mean|, so a perfectly flat history does not turn every tiny rise into a spike.

A spike is NOT added to the baseline: a burst of spikes must not raise the bar and hide the next
one. A lasting jump to a higher level therefore keeps being flagged, which for a loss or a
gradient norm is itself the anomaly. A NaN or infinite value counts as a spike and is not added.

`SpikeDetector.update` is O(1) (sliding sums, Welford-style); `find_spikes` is an independent,
plain re-computation of the same rule over a whole series, and the tests hold them equal.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np


class SpikeDetector:
    """Online spike detector; feed one value per step with `update`."""

    def __init__(
        self,
        window: int = 128,
        sigmas: float = 6.0,
        ratio: float = 10.0,
        min_history: int = 16,
        rel_floor: float = 0.01,
    ) -> None:
        if window < 2 or min_history < 2 or min_history > window:
            raise ValueError(
                f"SpikeDetector: need 2 <= min_history <= window, got window={window}, "
                f"min_history={min_history}"
            )
        self.window = window
        self.sigmas = sigmas
        self.ratio = ratio
        self.min_history = min_history
        self.rel_floor = rel_floor
        self._history: deque[float] = deque()
        self._mean = 0.0
        self._m2 = 0.0
        self.count = 0
        """Spikes flagged so far."""
        self.max_z = 0.0
        """Largest (value - mean) / std seen once the history was long enough."""
        self.last_z: float | None = None
        """(value - mean) / std of the latest judged value."""

    @property
    def score(self) -> float:
        """The largest excursion seen, in (floored) standard deviations above the mean."""
        return self.max_z

    @property
    def mean(self) -> float:
        """Mean of the accepted history."""
        return self._mean

    @property
    def std(self) -> float:
        """Population std of the accepted history."""
        n = len(self._history)
        return math.sqrt(max(self._m2, 0.0) / n) if n else 0.0

    def _add(self, x: float) -> None:
        self._history.append(x)
        n = len(self._history)
        delta = x - self._mean
        self._mean += delta / n
        self._m2 += delta * (x - self._mean)
        if n > self.window:
            old = self._history.popleft()
            n -= 1
            new_mean = (self._mean * (n + 1) - old) / n
            self._m2 -= (old - self._mean) * (old - new_mean)
            self._mean = new_mean
            self._m2 = max(self._m2, 0.0)

    def update(self, value: float) -> bool:
        """Judge `value` against the history; True when it is a spike."""
        if not math.isfinite(value):
            self.count += 1
            self.last_z = math.inf
            self.max_z = math.inf
            return True
        if len(self._history) < self.min_history:
            self._add(value)
            self.last_z = None
            return False
        spike, z = is_spike(value, self._mean, self.std, self.sigmas, self.ratio, self.rel_floor)
        self.last_z = z
        self.max_z = max(self.max_z, z)
        if spike:
            self.count += 1
        else:
            self._add(value)
        return spike


def is_spike(
    value: float, mean: float, std: float, sigmas: float, ratio: float, rel_floor: float
) -> tuple[bool, float]:
    """The rule itself: (spike?, z-score against the floored std)."""
    scale = max(std, rel_floor * abs(mean), 1e-300)
    z = (value - mean) / scale
    by_sigma = value > mean + sigmas * scale
    by_ratio = mean > 0 and value > ratio * mean
    return bool(by_sigma or by_ratio), z


def find_spikes(
    values: Sequence[float],
    window: int = 128,
    sigmas: float = 6.0,
    ratio: float = 10.0,
    min_history: int = 16,
    rel_floor: float = 0.01,
) -> list[int]:
    """Indices of the spikes in `values`, by the same rule as `SpikeDetector`, recomputed
    from the accepted history at each step (O(n x window): for offline use)."""
    accepted: list[float] = []
    found: list[int] = []
    for i, raw in enumerate(values):
        value = float(raw)
        if not math.isfinite(value):
            found.append(i)
            continue
        if len(accepted) < min_history:
            accepted.append(value)
            continue
        recent = np.asarray(accepted[-window:])
        spike, _ = is_spike(
            value, float(recent.mean()), float(recent.std()), sigmas, ratio, rel_floor
        )
        if spike:
            found.append(i)
        else:
            accepted.append(value)
    return found
