"""Seeds in rounds: a group-sequential design whose error rates hold across looks.

A test that is still undecided after its first k seeds per side gets more, in rounds, until it is
confirmed, rejected, or a cap is reached. Looking again after every round is the classic way to
buy false confirmations ("peeking"): at 2 -> 4 -> 6 -> 8 seeds with the fixed rule each time,
an A/A test "confirms" far more often than once. The design here spends the false-confirmation
rate over the looks instead, with the Lan-DeMets alpha-spending approach:

    K. K. G. Lan and D. L. DeMets, "Discrete sequential boundaries for clinical trials",
    Biometrika 70(3), 659-663, 1983. Spending functions: O'Brien-Fleming type
    alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)), Pocock type alpha(t) = alpha ln(1 + (e-1) t).
    I. K. Hwang, W. J. Shih and J. S. DeCani, "Group sequential designs using a family of type I
    error probability spending functions", Statistics in Medicine 9, 1439-1445, 1990:
    alpha(t) = alpha (1 - e^(-gamma t)) / (1 - e^(-gamma)), gamma = -4 here.
    C. Jennison and B. W. Turnbull, "Group Sequential Methods with Applications to Clinical
    Trials", Chapman & Hall/CRC, 2000: ch. 7 (spending functions), ch. 9 (repeated confidence
    intervals), ch. 11 (unknown variance: each look's z boundary is used at the same nominal
    significance level with Student's t), ch. 19 (the recursive numerical integration below).

The look at round k happens with n_k seeds per side (seed s of the test pairs with seed s of the
baseline); its information fraction is t_k = I_k / I_K with I = 1 / (1/n_b + 1/n_t), the last
planned look (the seed cap, or the last round the token cap affords) having t = 1. With
alpha = P(Z > z_confirm) (z_confirm 2 -> 2.3%, one-sided) the boundaries c_1..c_K satisfy, under
no effect, P(not crossed before look k, Z_k >= c_k) = alpha(t_k) - alpha(t_{k-1}), so the
chance of EVER confirming an A/A test is alpha, however many rounds run.

Each look forms the repeated confidence interval of the improvement, effect +- c_k x noise (c_k
t-corrected at the look's degrees of freedom, diag/verdict.py z_threshold):
- confirmed when its lower end is above 0 and the effect above min_effect (with the paired check
  and guards of diag/verdict.py);
- rejected when its upper end (with the reject side's boundary d_k) is below min_effect: the
  effect we want is out of reach (below 0: worse beyond noise). The reject side has its own
  spending function at the same alpha, so a test whose true effect is exactly min_effect is
  rejected at most alpha of the time. It is non-binding: c_k is computed as if no test were ever
  rejected, which only makes confirmation harder, never easier.
- otherwise another round runs, or, at the last look, the test is inconclusive.
Early rejection (diag/verdict.py early_reject) is the reject side evaluated while a round's jobs
train: the same d_k, at held-out marks, with a margin for the budget still to run. It can only
reject, so it cannot add false confirmations; at the end of the budget it is stricter than the
round's own reject rule, so it never stops a test that round would not reject on the same curve.

One round adds `round_seeds` per side (default: the baseline's seed count) to the test, and to
the baseline as far as it lacks them: the baseline's seed noise is half of the noise of the
difference and its seed count bounds the degrees of freedom, so a test growing alone past it
would stay limited by it. Baseline seeds are shared: a later test (or one running at the same
time) reuses those already recorded.

Pure functions over numbers; scipy.stats for the normal distribution.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

Spending = Literal["obrien_fleming", "pocock", "hwang_shih_decani"]
SPENDING = ("obrien_fleming", "pocock", "hwang_shih_decani")
HSD_GAMMA = -4.0
"""Gamma of the Hwang-Shih-DeCani spending function: -4 is its O'Brien-Fleming-like member
(gsDesign's default sfHSD), strict early and near the fixed rule at the last look, but it
spends enough at a first look (3% of alpha at t = 0.25, Lan-DeMets OBF 0.02%) that a huge
effect is decided there even with the few degrees of freedom of 2 seeds per side."""

GRID = 801
"""Points of the numerical-integration grid per look: boundaries to about 1e-4."""


def _normal():
    from scipy import stats  # imported on first use: most of a second (diag/verdict.py)

    return stats.norm


def spent(t: float, alpha: float, spending: Spending) -> float:
    """The false-confirmation rate spent by information fraction t (Lan-DeMets)."""
    t = min(max(t, 0.0), 1.0)
    if t == 0:
        return 0.0
    if spending == "obrien_fleming":
        normal = _normal()
        return float(2.0 * normal.sf(normal.isf(alpha / 2.0) / math.sqrt(t)))
    if spending == "pocock":
        return alpha * math.log(1.0 + (math.e - 1.0) * t)
    if spending == "hwang_shih_decani":
        return alpha * math.expm1(-HSD_GAMMA * t) / math.expm1(-HSD_GAMMA)
    raise ValueError(f"spending must be one of {SPENDING}, got {spending!r}")


def _grid(t: float, upper: float) -> tuple[np.ndarray, np.ndarray]:
    """Points and trapezoid weights on the score scale S = Z sqrt(t), from -8 sd to `upper`."""
    low = -8.0 * math.sqrt(t)
    upper = max(min(upper, 8.0 * math.sqrt(t)), low + 1e-9)
    points = np.linspace(low, upper, GRID)
    weights = np.full(GRID, points[1] - points[0])
    weights[[0, -1]] /= 2.0
    return points, weights


def _crossing(mass: np.ndarray, points: np.ndarray, step: float, t: float, c: float) -> float:
    """P(not stopped before, S_k >= c sqrt(t_k)): the paths' mass at the previous look times
    the chance that an increment of variance `step` carries each above the boundary."""
    from scipy.special import ndtr  # the normal cdf norm.sf calls, without its overhead

    return float(mass @ ndtr((points - c * math.sqrt(t)) / math.sqrt(step)))


def _solve(mass: np.ndarray, points: np.ndarray, step: float, t: float, target: float) -> float:
    """The boundary whose crossing probability is `target` (inf when nothing is left to spend)."""
    from scipy.optimize import brentq

    if target <= 0 or _crossing(mass, points, step, t, 40.0) > target:
        return math.inf
    return float(
        brentq(lambda c: _crossing(mass, points, step, t, c) - target, -10.0, 40.0, xtol=1e-7)
    )


@functools.lru_cache(maxsize=1024)
def boundaries(fractions: tuple[float, ...], alpha: float, spending: Spending) -> tuple[float, ...]:
    """The one-sided z boundaries c_1..c_K at increasing information fractions (the last 1).

    Recursive numerical integration over the score S_k = Z_k sqrt(t_k), a Gaussian random walk
    with independent increments under no effect (Jennison & Turnbull ch. 19): the density of
    S_k over the paths not yet stopped is propagated look to look, and c_k solves "the mass
    leaving above c_k at look k = the rate spent between t_{k-1} and t_k". Written out because
    no well-kept Python package computes group-sequential boundaries (R's gsDesign and rpact
    do); checked against their published values in tests/test_sequential.py.
    """
    normal = _normal()
    if not fractions or any(b <= a for a, b in zip(fractions, fractions[1:], strict=False)):
        raise ValueError(f"boundaries: fractions must increase, got {fractions}")
    found: list[float] = []
    density = points = weights = None
    previous_t = previous_spent = 0.0
    for t in fractions:
        target = spent(t, alpha, spending) - previous_spent
        if points is None:
            bound = float(normal.isf(target)) if target > 0 else math.inf
        else:
            bound = _solve(density * weights, points, t - previous_t, t, target)
        found.append(bound)
        new_points, new_weights = _grid(t, bound * math.sqrt(t))
        if points is None:
            density = normal.pdf(new_points / math.sqrt(t)) / math.sqrt(t)
        else:
            scale = math.sqrt(t - previous_t)
            kernel = normal.pdf((new_points[:, None] - points[None, :]) / scale) / scale
            density = kernel @ (density * weights)
        points, weights = new_points, new_weights
        previous_t, previous_spent = t, spent(t, alpha, spending)
    return tuple(found)


def information(n_baseline: int, n_test: int) -> float:
    """Information of the difference of seed means, per unit of per-seed variance."""
    return 1.0 / (1.0 / n_baseline + 1.0 / n_test)


@dataclass(frozen=True)
class Design:
    """The planned looks of one test: seeds per side at each, and the two spending functions."""

    seeds: tuple[int, ...]
    """Seeds per side at each look, increasing, e.g. (2, 4, 6, 8)."""
    alpha: float
    """One-sided false-confirmation rate over all looks: P(Z > z_confirm)."""
    confirm_spending: Spending = "hwang_shih_decani"
    reject_spending: Spending = "pocock"

    @functools.cached_property
    def fractions(self) -> tuple[float, ...]:
        last = information(self.seeds[-1], self.seeds[-1])
        return tuple(information(n, n) / last for n in self.seeds)

    def confirm_z(self, look: int) -> float:
        """The z the improvement must clear at look `look` (0-based) to confirm."""
        return boundaries(self.fractions, self.alpha, self.confirm_spending)[look]

    def reject_z(self, look: int) -> float:
        """The z of the reject side's interval at look `look` (0-based)."""
        return boundaries(self.fractions, self.alpha, self.reject_spending)[look]

    def look_at(self, seeds: int) -> int:
        """The look taken with `seeds` per side (the last look at or below it)."""
        return (
            max(i for i, n in enumerate(self.seeds) if n <= seeds) if seeds >= self.seeds[0] else 0
        )

    @property
    def max_seeds(self) -> int:
        return self.seeds[-1]


def fixed(seeds: int, alpha: float) -> Design:
    """One look: the fixed-k rule (c = z_confirm on both sides)."""
    return Design((seeds,), alpha)


def plan(
    start: int,
    max_seeds: int,
    alpha: float,
    *,
    round_seeds: int = 0,
    tokens_per_seed: int = 0,
    max_tokens: int = 0,
    confirm_spending: Spending = "hwang_shih_decani",
    reject_spending: Spending = "pocock",
) -> Design:
    """The looks of a test that starts at `start` seeds per side and adds `round_seeds` (0: as
    many as it started with) per round up to `max_seeds`, or as far as `max_tokens` reaches.

    The token cap counts what the test itself trains: its own seeds and the baseline seeds it
    adds (assumed all new; seeds another test already recorded only make it cheaper). A look
    the cap cannot afford is dropped from the plan, so the last affordable look spends all of
    alpha (t = 1 there): the cap is set before any data is seen, which is what keeps the
    design's error rate."""
    if start < 1:
        raise ValueError(f"a test starts with at least 1 seed per side, got {start}")
    step = round_seeds or max(start, 1)
    seeds = [start]
    while seeds[-1] < max_seeds:
        seeds.append(min(max_seeds, seeds[-1] + step))
    if max_tokens and tokens_per_seed:

        def cost(n: int) -> int:
            return (n + max(0, n - start)) * tokens_per_seed

        seeds = [n for n in seeds if n == start or cost(n) <= max_tokens]
    return Design(tuple(seeds), alpha, confirm_spending, reject_spending)
