"""The verdict on one hypothesis: confirmed, rejected or inconclusive against the baseline.

A hypothesis changes one variable and is run as short jobs with the same k seeds as the recorded
baseline (seed s of the test pairs with seed s of the baseline). Both sides are read at MATCHED
TOKENS: the largest token count every baseline and every test run reached, each run's value being
the one logged at the largest step <= that count (for per-step noisy metrics such as
perf/tokens_per_s: the median over the last 25% of the tokens up to it; `MetricSpec.window`).
So a batch-size change is compared at the same tokens, not the same steps.

The rule (numbers in diag/tables/verdict.yaml; defaults in brackets):

- Seed noise. sigma_b = sample std of the baseline's per-seed values (ddof 1, needs >= 2 seeds;
  with one seed an assumed relative sigma [single_seed_sigma 0.5%], said so in the reason).
  sigma_t = the test's sample std with >= 2 test seeds, else sigma_b. The noise of the
  difference of seed means is sigma_diff = sqrt(sigma_b^2/n_b + sigma_t^2/n_t); `noise` is it
  relative to |baseline mean|, `effect` the relative improvement (direction-aware: positive =
  better), z = effect / noise.
- Small-sample correction [small_sample true]. With 2-5 seeds sigma is itself a noisy estimate,
  so the z thresholds are replaced by the Student-t quantile with the same one-sided confidence
  (z_confirm 2.0 -> 97.7%) at the Welch-Satterthwaite degrees of freedom (n_b - 1 when the test
  borrows sigma_b; normal when sigma is assumed). At 3 vs 3 seeds that is 2.9 to 4.5 sigma;
  without it an A/A comparison "confirms" 6-7% of the time instead of about 2%.
  `Verdict.z_needed` is the threshold used.
- Paired comparison over the seeds present on both sides: d_s = test_s - baseline_s,
  t = mean(d) / (sd(d)/sqrt(n)), df = n - 1, two-sided p from the t distribution (computed here,
  no scipy). Reported always (n >= 2); with >= paired_min_seeds [3] common seeds its sign must
  agree with the improvement before a confirmation.
- A guard (a metric that must not get worse, e.g. perf/tokens_per_s while testing eval/loss)
  REGRESSES when it is worse than the baseline by more than z_guard [2.0] x its noise (same
  correction) AND by more than a relative floor [guard_floor 1%, or the guard's own min_effect].
- rejected: a test run diverged (NaN/inf in the primary metric, or `diverged=True`); or a guard
  regressed; or the test is worse beyond noise (effect < -z_needed x noise); or even the upper
  bound of the improvement, effect + z_needed x noise, is below min_effect (it cannot be the
  effect we want).
- confirmed: effect > min_effect AND effect > z_needed x noise, no guard regressed, and the
  paired comparison (when available) agrees in sign.
- Against a diverged baseline (a baseline seed reached NaN/inf in the primary, or the caller says
  it diverged, e.g. before its first point) nothing finite can be matched, so the question is
  whether the divergence goes away: a test that diverges too is rejected; one whose every seed
  trains past the point where the baseline blew up, finite, is confirmed ("removes the
  divergence") when every baseline seed diverged, and inconclusive when some stayed finite (one
  seed's divergence flipping can be chance).
- inconclusive: anything else. `decide` then estimates the seeds per side that would separate
  delta = min_effect (or the measured effect when min_effect is 0) from seed noise:
  n ~ 2 (z sigma / delta)^2 with sigma the relative per-seed sigma, raised until the
  small-sample threshold at 2n - 2 degrees of freedom is also met.

Early rejection (`early_reject`, for tests still running) stops a test that is clearly worse:
at marks at or after early.min_frac [30%] of the token budget, the test's seed mean is worse than
the baseline's at that mark by more than early.z [4] x the per-seed sigma there (the larger of
the baseline's and the test's sample sigma; the single-seed sigma when neither has two seeds)
plus a relative margin early.floor [1%] + early.slack [5%] x (1 - f) at budget fraction f (a
curve that is worse early and better late has the most room to catch up early), at
early.consecutive [2] consecutive marks. A diverged test is stopped at once. With the defaults
and marks every 5% of the budget, a +10% loss is stopped at 35% (65% of the budget saved).
Caveat: a hypothesis whose gain comes only at the end BY CONSTRUCTION (a schedule change such as
WSD, whose stable phase sits above a cosine baseline until its decay) can trail by more than
that margin mid-run; pass `min_frac` near 1 (or skip early_reject) for such hypotheses.

Everything here is a pure function over numbers: no tracking, config or training imports.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import yaml

Points = list[tuple[int, float]]
"""(tokens seen, value) pairs: one metric's history in one run, in any order."""

Runs = Mapping[int, Points]
"""seed -> that seed's history of one metric."""

TABLE = Path(__file__).parent / "tables" / "verdict.yaml"
"""The shipped thresholds."""

STATUSES = ("confirmed", "rejected", "inconclusive")


# ---------------------------------------------------------------------------------------------
# Parameters


@dataclass(frozen=True)
class EarlyParams:
    """Thresholds of early rejection (`early:` in verdict.yaml)."""

    min_frac: float = 0.3
    """Judge only marks at or after this fraction of the token budget."""
    z: float = 4.0
    """How many per-seed sigmas worse the test's seed mean must be at a mark."""
    floor: float = 0.01
    """Relative margin added to z x sigma (a tiny sigma must not make 0.1% count as worse)."""
    slack: float = 0.05
    """Further relative margin per unit of budget still to run: slack x (1 - f) at fraction f
    (early in the run a late-improving curve has the most room to catch up)."""
    consecutive: int = 2
    """How many consecutive marks must be worse before stopping."""


@dataclass(frozen=True)
class VerdictParams:
    """The numbers of the verdict rule (`verdict:` in verdict.yaml)."""

    z_confirm: float = 2.0
    """Improvement must exceed this many noise units (before the small-sample correction)."""
    small_sample: bool = True
    """Replace z thresholds by the Student-t quantile of equal confidence at the Welch df."""
    single_seed_sigma: float = 0.005
    """Relative per-seed sigma assumed when the baseline has one seed."""
    z_guard: float = 2.0
    """A guard worse than baseline by more than this many noise units (and the floor) regressed."""
    guard_floor: float = 0.01
    """Relative regression a guard may show without counting (unless its min_effect > 0)."""
    paired_min_seeds: int = 3
    """Common seeds from which the paired comparison must agree in sign to confirm."""
    windows: dict[str, float] = field(default_factory=lambda: {"perf/": 0.25})
    """Metric-name prefix -> median window (fraction of tokens) for per-step noisy metrics."""
    max_seeds: int = 64
    """Cap of the seeds-needed estimate."""
    early: EarlyParams = field(default_factory=EarlyParams)
    """Early-rejection thresholds."""


@functools.cache
def load_params(path: str | Path = TABLE) -> VerdictParams:
    """The `verdict:` table of a YAML file (read once per process and path). An unknown key is a
    ValueError naming it, so a typo cannot silently fall back to a default."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    raw = data.get("verdict") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: needs a top-level `verdict:` mapping")
    raw = dict(raw)
    early_raw = raw.pop("early", {}) or {}
    known = set(VerdictParams.__dataclass_fields__) - {"early"}
    early_known = set(EarlyParams.__dataclass_fields__)
    for key in raw:
        if key not in known:
            raise ValueError(f"{path}: unknown key verdict.{key}; known: {sorted(known)}")
    for key in early_raw:
        if key not in early_known:
            raise ValueError(
                f"{path}: unknown key verdict.early.{key}; known: {sorted(early_known)}"
            )
    return VerdictParams(**raw, early=EarlyParams(**early_raw))


# ---------------------------------------------------------------------------------------------
# Inputs and outputs


@dataclass(frozen=True)
class MetricSpec:
    """One metric to compare and which way is better."""

    metric: str
    """MLflow metric name, e.g. "eval/loss"."""
    direction: str
    """"min" (lower is better) or "max" (higher is better)."""
    min_effect: float = 0.0
    """Smallest relative improvement that matters (0.01 = 1%). For a guard: the relative
    regression tolerated (0 = the table's guard_floor)."""
    window: float | None = None
    """Median window for `matched_value` (fraction of the tokens up to the mark; 0 = the single
    value logged there). None: by metric-name prefix from the table (perf/* -> 0.25, else 0)."""

    def __post_init__(self) -> None:
        if self.direction not in ("min", "max"):
            raise ValueError(
                f"MetricSpec {self.metric!r}: direction must be 'min' or 'max', "
                f"got {self.direction!r}"
            )
        if not self.min_effect >= 0:
            raise ValueError(f"MetricSpec {self.metric!r}: min_effect must be >= 0")
        if self.window is not None and not 0 <= self.window <= 1:
            raise ValueError(f"MetricSpec {self.metric!r}: window must be within [0, 1]")


@dataclass
class Verdict:
    """The outcome of comparing a hypothesis's runs with the baseline's at matched tokens."""

    status: str
    """"confirmed" | "rejected" | "inconclusive"."""
    effect: float
    """Relative improvement of the test's seed mean over the baseline's (positive = better)."""
    effect_abs: float
    """Test mean - baseline mean, in metric units (sign as measured, not direction-aware)."""
    noise: float
    """Relative noise (one sigma) of the difference of seed means."""
    z: float
    """effect / noise."""
    tokens: int
    """The matched token count both sides were read at."""
    n_baseline: int
    """Baseline seeds compared."""
    n_test: int
    """Test seeds compared (diverged ones included)."""
    paired: dict | None
    """Per-seed differences over common seeds: n, seeds, mean and sd (metric units), effect
    (relative, direction-aware), t (positive = test better), df, p (two-sided), available
    (n >= paired_min_seeds), agrees (sign agrees with `effect`). None below 2 common seeds."""
    guards: list[dict]
    """Per guard: metric, baseline, test, effect, noise, z, z_needed, floor, regressed."""
    reason: str
    """One line with the numbers behind the status."""
    decide: str | None = None
    """For an inconclusive verdict: what would decide it (seeds needed per side)."""
    metric: str = ""
    """The primary metric's name."""
    baseline_value: float = math.nan
    """The baseline's seed mean at the matched tokens."""
    test_value: float = math.nan
    """The test's seed mean at the matched tokens."""
    z_needed: float = math.nan
    """The z the effect had to exceed (z_confirm after the small-sample correction)."""
    df: float = math.inf
    """Degrees of freedom of the noise estimate (inf when sigma was assumed)."""
    looks: int = 1
    """How many candidates the test was the best of (a sweep's trials); z_needed corrects for it."""
    baseline_sigma: float = math.nan
    """Per-seed spread (sample std) of the baseline at the matched tokens, metric units."""
    test_sigma: float = math.nan
    """Per-seed spread of the test (the baseline's when the test has one seed)."""

    def to_dict(self) -> dict:
        """Plain, JSON-safe dict: NaN and infinite floats become None."""
        return _json_safe(asdict(self))


@dataclass(frozen=True)
class EarlyStop:
    """Why and where a running test was stopped early."""

    tokens: int
    """Token mark at which the rule fired (for a divergence: the first NaN/inf mark, or the
    test's latest mark when the caller marked it)."""
    reason: str
    """One line with the numbers."""
    z: float
    """How many per-seed sigmas the test was worse at that mark (inf for a divergence)."""
    budget_tokens: int = 0
    """The test's token budget (0 when unknown)."""

    @property
    def saved(self) -> float:
        """Fraction of the budget not spent: 1 - tokens / budget."""
        return 1.0 - self.tokens / self.budget_tokens if self.budget_tokens else 0.0

    def to_dict(self) -> dict:
        """Plain, JSON-safe dict (with `saved`)."""
        return _json_safe({**asdict(self), "saved": self.saved})


# ---------------------------------------------------------------------------------------------
# Reading values at matched tokens


def _sorted(points: Points) -> list[tuple[int, float]]:
    return sorted(((int(s), float(v)) for s, v in points), key=lambda p: p[0])


def matched_value(points: Points, tokens: int, window: float = 0.0) -> float | None:
    """The value at the largest step <= `tokens` (None when no step is). With `window` > 0 the
    median of the values logged in [(1 - window) * tokens, tokens] (falling back to that single
    value when the window holds none): the level of a per-step noisy metric such as
    perf/tokens_per_s. A NaN/inf value is returned as it is (divergence shows)."""
    pts = [p for p in _sorted(points) if p[0] <= tokens]
    if not pts:
        return None
    if window > 0:
        start = (1.0 - window) * tokens
        vals = [v for s, v in pts if s >= start]
        if vals:
            return float(np.median(vals))
    return pts[-1][1]


def _last_finite_step(points: Points) -> int | None:
    steps = [s for s, v in _sorted(points) if math.isfinite(v)]
    return steps[-1] if steps else None


def _has_nonfinite(points: Points) -> bool:
    return any(not math.isfinite(float(v)) for _, v in points)


def _window(spec: MetricSpec, params: VerdictParams) -> float:
    if spec.window is not None:
        return spec.window
    for prefix, win in params.windows.items():
        if spec.metric.startswith(prefix):
            return float(win)
    return 0.0


# ---------------------------------------------------------------------------------------------
# Student t, written out (no scipy)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            step = d * c
            h *= step
        if abs(step - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom (normal when df is inf)."""
    if math.isnan(t):
        return math.nan
    if math.isinf(df):
        return 1.0 - NormalDist().cdf(t)
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@functools.lru_cache(maxsize=4096)
def _t_ppf_cached(p: float, df: float) -> float:
    lo, hi = 0.0, max(1.0, NormalDist().inv_cdf(p))
    while t_sf(hi, df) > 1.0 - p:
        lo, hi = hi, hi * 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if t_sf(mid, df) > 1.0 - p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10 * hi:
            break
    return 0.5 * (lo + hi)


def t_ppf(p: float, df: float) -> float:
    """The t quantile for a probability p in (0.5, 1) (normal when df is inf)."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"t_ppf: p must be in (0.5, 1), got {p}")
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    return _t_ppf_cached(p, round(float(df), 3))


def bonferroni_z(z: float, looks: int) -> float:
    """The one-sided z whose tail is z's tail divided by `looks`: confirming the best of `looks`
    candidates is then no likelier by chance than confirming one."""
    if looks <= 1:
        return z
    tail = 1.0 - NormalDist().cdf(z)
    return NormalDist().inv_cdf(1.0 - tail / looks)


def z_threshold(z: float, df: float, small_sample: bool = True) -> float:
    """`z` as a threshold on effect/noise when the noise has `df` degrees of freedom: the t
    quantile of the same one-sided confidence as z under the normal (z itself when df is inf or
    the correction is off)."""
    if not small_sample or math.isinf(df) or z <= 0:
        return z
    return t_ppf(NormalDist().cdf(z), df)


# ---------------------------------------------------------------------------------------------
# The difference of two sets of seeds


@dataclass(frozen=True)
class _Contrast:
    """Test vs baseline seed means at one token mark."""

    mean_b: float
    mean_t: float
    sigma_b: float
    """Per-seed sigma of the baseline (metric units; assumed when single seed)."""
    sigma_t: float
    scale: float
    """|baseline mean| (1 when it is 0): the denominator of the relative numbers."""
    effect: float
    effect_abs: float
    noise: float
    z: float
    df: float
    assumed: bool
    """True when sigma_b is the single-seed assumption."""


def _ratio(num: float, den: float) -> float:
    """num / den, with +-inf for a nonzero num over 0 and 0 for 0 / 0."""
    if den > 0:
        return num / den
    return math.copysign(math.inf, num) if num else 0.0


def _sample_sigma(values: Sequence[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) >= 2 else math.nan


def _contrast(
    spec: MetricSpec, base: Mapping[int, float], test: Mapping[int, float], params: VerdictParams
) -> _Contrast:
    b, t = list(base.values()), list(test.values())
    mean_b, mean_t = float(np.mean(b)), float(np.mean(t))
    scale = abs(mean_b) or 1.0
    assumed = len(b) < 2
    sigma_b = params.single_seed_sigma * scale if assumed else _sample_sigma(b)
    df_b = math.inf if assumed else len(b) - 1.0
    var_b = sigma_b**2 / len(b)
    if len(t) >= 2:
        sigma_t = _sample_sigma(t)
        var_t = sigma_t**2 / len(t)
        parts = [(var_b, df_b), (var_t, len(t) - 1.0)]
        den = sum(v * v / d for v, d in parts if math.isfinite(d))
        df = (var_b + var_t) ** 2 / den if den > 0 else math.inf
    else:  # the test borrows the baseline's sigma: one estimate, its df
        sigma_t = sigma_b
        var_t = sigma_t**2 / len(t)
        df = df_b
    sign = 1.0 if spec.direction == "max" else -1.0
    effect_abs = mean_t - mean_b
    effect = sign * effect_abs / scale
    noise = math.sqrt(var_b + var_t) / scale
    z = _ratio(effect, noise)
    return _Contrast(
        mean_b, mean_t, sigma_b, sigma_t, scale, effect, effect_abs, noise, z, df, assumed
    )


def _paired(
    spec: MetricSpec,
    base: Mapping[int, float],
    test: Mapping[int, float],
    scale: float,
    params: VerdictParams,
) -> dict | None:
    seeds = sorted(set(base) & set(test))
    if len(seeds) < 2:
        return None
    sign = 1.0 if spec.direction == "max" else -1.0
    d = np.array([test[s] - base[s] for s in seeds], dtype=float)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    n = len(seeds)
    better = sign * mean
    if sd <= 1e-12 * max(abs(mean), scale):  # equal differences up to rounding
        sd = 0.0
    t = _ratio(better, sd / math.sqrt(n))
    p = 2.0 * t_sf(abs(t), n - 1.0) if t == t else math.nan
    return {
        "n": n,
        "seeds": seeds,
        "mean": mean,
        "sd": sd,
        "effect": better / scale,
        "t": t,
        "df": n - 1,
        "p": min(1.0, p),
        "available": n >= params.paired_min_seeds,
        "agrees": better > 0,
    }


# ---------------------------------------------------------------------------------------------
# Formatting


def _num(x: float) -> str:
    if not math.isfinite(x):
        return str(x)
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _pct(x: float, signed: bool = False) -> str:
    if not math.isfinite(x):
        return str(x)
    v = 100.0 * x
    text = f"{v:.0f}" if abs(v) >= 100 else f"{v:.2g}"
    if "e" in text:
        text = f"{v:.1e}"
    return f"+{text}%" if signed and v > 0 else f"{text}%"


def _zs(z: float) -> str:
    return f"{z:.1f}" if math.isfinite(z) else ("inf" if z > 0 else "-inf")


def _summary(metric: str, c: _Contrast) -> str:
    """`eval/loss 3.412 -> 3.287 (-3.7% ± 0.4%, z=9.1)`: change as measured, noise, z."""
    change = c.effect_abs / c.scale
    return (
        f"{metric} {_num(c.mean_b)} -> {_num(c.mean_t)} "
        f"({_pct(change, signed=True)} ± {_pct(c.noise)}, z={_zs(c.z)})"
    )


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        return _json_safe(obj.item())
    return obj


# ---------------------------------------------------------------------------------------------
# compare


def _values(runs: Runs, tokens: int, window: float, metric: str, side: str) -> dict[int, float]:
    out = {}
    for seed, pts in runs.items():
        v = matched_value(pts, tokens, window)
        if v is None:
            raise ValueError(f"{side} seed {seed}: no {metric} logged at or before {tokens} tokens")
        if not math.isfinite(v):
            raise ValueError(f"{side} seed {seed}: {metric} is {v} at {tokens} tokens")
        out[int(seed)] = v
    return out


def _seeds_needed(c: _Contrast, spec: MetricSpec, params: VerdictParams, n_b: int, n_t: int) -> str:
    """What would decide an inconclusive verdict: seeds per side for delta vs seed noise."""
    sigma = math.sqrt((c.sigma_b**2 + c.sigma_t**2) / 2.0) / c.scale
    delta = spec.min_effect if spec.min_effect > 0 else abs(c.effect)
    label = "min effect" if spec.min_effect > 0 else "measured effect"
    if delta <= 0:
        return (
            "no effect measured and min_effect is 0: set a min_effect to say which effect "
            "more seeds should resolve"
        )
    z = params.z_confirm
    if sigma <= 0:
        return f"seed noise is 0 here; rerun with min_effect below the {_pct(c.effect)} measured"
    n = max(2, math.ceil(2.0 * (z * sigma / delta) ** 2))
    while n <= params.max_seeds:
        zn = z_threshold(z, 2.0 * n - 2.0, params.small_sample)
        if delta > zn * sigma * math.sqrt(2.0 / n):
            break
        n += 1
    if n > params.max_seeds:
        return (
            f"more than {params.max_seeds} seeds per side would be needed to separate a "
            f"{_pct(delta)} {label} from seed noise (σ={_pct(sigma)} per seed): lengthen the "
            "token budget or drop the hypothesis"
        )
    raised = n > max(2, math.ceil(2.0 * (z * sigma / delta) ** 2))
    return (
        f"about {n} seeds per side (now {n_b}/{n_t}) would separate a {_pct(delta)} {label} "
        f"from seed noise (σ={_pct(sigma)} per seed; n ≈ 2(zσ/δ)² with z={z:g}"
        f"{', raised for the few-seed t correction' if raised else ''})"
    )


def _against_diverged(
    baseline: Runs,
    test: Runs,
    primary: MetricSpec,
    blown: list[int],
    bad: list[int],
    diverged: bool,
) -> Verdict:
    """The verdict against a baseline that diverged: the question is no longer "better at
    matched tokens" (there is nothing finite to match) but "does the divergence go away"."""
    n = len(baseline)
    # Where each diverged baseline seed blew up: its first NaN/inf point, else its last point.
    where = max(
        min(
            (s for s, v in baseline[seed] if not math.isfinite(v)),
            default=max((s for s, _ in baseline[seed]), default=0),
        )
        for seed in blown
    )
    reached = min((_last_finite_step(pts) or 0) for pts in test.values())
    base = (
        f"{primary.metric} went NaN/inf in baseline seed(s) {', '.join(map(str, blown))} "
        f"of {n} (by {where:,} tokens)"
    )

    def verdict(status: str, reason: str, decide: str | None = None) -> Verdict:
        return Verdict(
            status=status,
            effect=math.nan,
            effect_abs=math.nan,
            noise=math.nan,
            z=math.nan,
            tokens=int(reached),
            n_baseline=n,
            n_test=len(test),
            paired=None,
            guards=[],
            reason=reason,
            decide=decide,
            metric=primary.metric,
        )

    if diverged or bad:
        who = f"test seed(s) {', '.join(map(str, bad))}" if bad else "the test (marked)"
        return verdict("rejected", f"diverged: {who} too, as {base}")
    if reached <= where:
        return verdict(
            "inconclusive",
            f"{base}; the test stopped at {reached:,} tokens, before that point",
            "run the test to the baseline's budget",
        )
    if len(blown) < n:
        return verdict(
            "inconclusive",
            f"{base}, in no test seed: with other baseline seeds "
            "finite, a removed divergence cannot be told from chance",
            "record a baseline with more seeds (every one diverging)",
        )
    return verdict(
        "confirmed",
        f"removes the divergence: {base}; every test seed trained to "
        f"{reached:,} tokens with a finite {primary.metric}",
    )


def compare(
    baseline: Runs,
    test: Runs,
    primary: MetricSpec,
    guards: Sequence[MetricSpec] = (),
    baseline_guards: Mapping[str, Runs] | None = None,
    test_guards: Mapping[str, Runs] | None = None,
    *,
    diverged: bool = False,
    baseline_diverged: Sequence[int] = (),
    looks: int = 1,
    params: VerdictParams | None = None,
) -> Verdict:
    """The verdict on `test` against `baseline` for the `primary` metric (rule: module docstring).

    `baseline` and `test` map seed -> the primary metric's history (tokens, value) in that run.
    `guards` are metrics that must not regress; their histories are `baseline_guards[metric]`
    and `test_guards[metric]`, each again seed -> points, read at the primary's matched tokens.
    `diverged=True` marks the test as diverged (a NaN/inf in the primary is detected anyway);
    `baseline_diverged` names baseline seeds that diverged, e.g. before their first point.
    `looks` > 1: `test` is the best of that many tried (a sweep); z_confirm is raised to keep the
    family-wise false-confirmation rate at one look's (Bonferroni, bonferroni_z).
    `params` overrides the table (default: diag/tables/verdict.yaml).
    """
    params = params or load_params()
    if not baseline:
        raise ValueError("compare: no baseline runs")
    if not test:
        raise ValueError("compare: no test runs")
    blown = {s for s, pts in baseline.items() if _has_nonfinite(pts)} | set(baseline_diverged)
    for seed, pts in baseline.items():
        if not pts and seed not in blown:
            raise ValueError(f"baseline seed {seed}: no {primary.metric} points")
    bad = sorted(s for s, pts in test.items() if _has_nonfinite(pts))
    if blown:
        return _against_diverged(baseline, test, primary, sorted(blown), bad, diverged)
    ends = [_last_finite_step(pts) for pts in baseline.values()]
    ends += [_last_finite_step(pts) for s, pts in test.items() if s not in bad]
    if any(e is None for e in ends):
        raise ValueError(f"compare: a run has no finite {primary.metric} value")
    tokens = min(ends) if ends else 0

    if diverged or bad:
        who = (
            f"test seed(s) {', '.join(map(str, bad))} reached NaN/inf in {primary.metric}"
            if bad
            else "the test was marked diverged by the caller"
        )
        return Verdict(
            status="rejected",
            effect=math.nan,
            effect_abs=math.nan,
            noise=math.nan,
            z=math.nan,
            tokens=int(tokens),
            n_baseline=len(baseline),
            n_test=len(test),
            paired=None,
            guards=[],
            reason=f"diverged: {who}",
            metric=primary.metric,
        )

    window = _window(primary, params)
    base_v = _values(baseline, tokens, window, primary.metric, "baseline")
    test_v = _values(test, tokens, window, primary.metric, "test")
    c = _contrast(primary, base_v, test_v, params)
    z_confirm = bonferroni_z(params.z_confirm, looks)
    z_needed = z_threshold(z_confirm, c.df, params.small_sample)
    paired = _paired(primary, base_v, test_v, c.scale, params)

    guard_rows = []
    for g in guards:
        b_runs = (baseline_guards or {}).get(g.metric)
        t_runs = (test_guards or {}).get(g.metric)
        if not b_runs or not t_runs:
            raise ValueError(
                f"guard {g.metric}: pass its histories in baseline_guards and test_guards "
                "(metric -> seed -> points)"
            )
        gw = _window(g, params)
        gc = _contrast(
            g,
            _values(b_runs, tokens, gw, g.metric, "baseline"),
            _values(t_runs, tokens, gw, g.metric, "test"),
            params,
        )
        gz = z_threshold(params.z_guard, gc.df, params.small_sample)
        floor = g.min_effect if g.min_effect > 0 else params.guard_floor
        regressed = gc.effect < -gz * gc.noise and gc.effect < -floor
        guard_rows.append(
            {
                "metric": g.metric,
                "direction": g.direction,
                "baseline": gc.mean_b,
                "test": gc.mean_t,
                "effect": gc.effect,
                "effect_abs": gc.effect_abs,
                "noise": gc.noise,
                "z": gc.z,
                "z_needed": gz,
                "floor": floor,
                "regressed": bool(regressed),
                "summary": _summary(g.metric, gc),
            }
        )

    summary = _summary(primary.metric, c)
    zn = f"{z_needed:.2g}σ noise" + (
        f" (z {z_confirm:.3g} at {c.df:.1f} df)" if z_needed != z_confirm else ""
    )
    if looks > 1:
        zn += f"; Bonferroni: best of {looks} trials, z {params.z_confirm:g} -> {z_confirm:.3g}"
    me = _pct(primary.min_effect)
    decide = None
    regressed = [g for g in guard_rows if g["regressed"]]
    if regressed:
        status = "rejected"
        reason = "; ".join(
            f"guard {g['summary']} regressed beyond {_pct(g['floor'])} and {g['z_needed']:.2g}σ"
            for g in regressed
        )
        reason += f"; primary {summary}"
    elif c.effect < -z_needed * c.noise:
        status = "rejected"
        reason = f"{summary}: worse than baseline beyond {zn}"
    elif c.effect + z_needed * c.noise < primary.min_effect:
        status = "rejected"
        upper = c.effect + z_needed * c.noise
        reason = f"{summary}: improvement at most {_pct(upper)} at {zn}, below min effect {me}"
    elif c.effect > primary.min_effect and c.effect > z_needed * c.noise:
        if paired is not None and paired["available"] and not paired["agrees"]:
            status = "inconclusive"
            reason = (
                f"{summary}: beyond min effect {me} and {zn}, but the paired comparison over "
                f"{paired['n']} common seeds disagrees in sign (t={_zs(paired['t'])})"
            )
            decide = "rerun with the same seeds on both sides; " + _seeds_needed(
                c, primary, params, len(base_v), len(test_v)
            )
        else:
            status = "confirmed"
            reason = f"{summary} beyond min effect {me} and {zn}"
            if paired is not None and paired["available"]:
                reason += f"; paired over {paired['n']} seeds t={_zs(paired['t'])}"
    else:
        status = "inconclusive"
        if c.effect <= z_needed * c.noise:
            why = f"within {zn}"
        else:
            why = f"beyond noise but below min effect {me}, which it may still reach"
        reason = f"{summary}: {why}"
        decide = _seeds_needed(c, primary, params, len(base_v), len(test_v))
    if c.assumed:
        reason += (
            f"; 1 baseline seed: seed noise assumed {_pct(params.single_seed_sigma)} per seed "
            "(verdict.yaml single_seed_sigma)"
        )
    return Verdict(
        status=status,
        effect=c.effect,
        effect_abs=c.effect_abs,
        noise=c.noise,
        z=c.z,
        tokens=int(tokens),
        n_baseline=len(base_v),
        n_test=len(test_v),
        paired=paired,
        guards=guard_rows,
        reason=reason,
        decide=decide,
        metric=primary.metric,
        baseline_value=c.mean_b,
        test_value=c.mean_t,
        z_needed=z_needed,
        df=c.df,
        looks=looks,
        baseline_sigma=c.sigma_b,
        test_sigma=c.sigma_t,
    )


# ---------------------------------------------------------------------------------------------
# Early rejection


def early_reject(
    baseline: Runs,
    partial_test: Runs,
    primary: MetricSpec,
    budget_tokens: int,
    *,
    diverged: bool = False,
    min_frac: float | None = None,
    params: VerdictParams | None = None,
) -> EarlyStop | None:
    """Stop a running test that is clearly worse than the baseline (rule: module docstring).

    Scans the token marks the test logged (its grid; the baseline is read at its largest step
    <= each mark) up to the latest one every run reached, and returns the FIRST mark at which
    the rule held at `early.consecutive` consecutive marks: called on every new mark, that is
    the mark just reached. None: keep running. `min_frac` overrides early.min_frac (pass ~1 for
    hypotheses whose gain only shows at the end, e.g. schedule changes)."""
    params = params or load_params()
    ep = params.early
    if budget_tokens <= 0:
        raise ValueError(f"early_reject: budget_tokens must be > 0, got {budget_tokens}")
    if not baseline or not partial_test:
        return None
    bad = sorted(s for s, pts in partial_test.items() if _has_nonfinite(pts))
    if diverged or bad:
        first_bad = [
            int(s) for pts in partial_test.values() for s, v in pts if not math.isfinite(v)
        ]
        last = max((int(s) for pts in partial_test.values() for s, _ in pts), default=0)
        last = min(first_bad) if first_bad else last
        who = f"test seed(s) {', '.join(map(str, bad))}" if bad else "the test (marked)"
        return EarlyStop(
            tokens=last,
            reason=f"diverged: {who} reached NaN/inf in {primary.metric}",
            z=math.inf,
            budget_tokens=budget_tokens,
        )
    ends = [_last_finite_step(pts) for pts in [*baseline.values(), *partial_test.values()]]
    if any(e is None for e in ends):
        return None
    common = min(ends)
    start = (ep.min_frac if min_frac is None else min_frac) * budget_tokens
    marks = sorted(
        {int(s) for pts in partial_test.values() for s, _ in pts if start <= s <= common}
    )
    window = _window(primary, params)
    sign = 1.0 if primary.direction == "max" else -1.0
    run = 0
    for mark in marks:
        b = [matched_value(p, mark, window) for p in baseline.values()]
        t = [matched_value(p, mark, window) for p in partial_test.values()]
        if any(v is None for v in b + t):
            run = 0
            continue
        mean_b, mean_t = float(np.mean(b)), float(np.mean(t))
        scale = abs(mean_b) or 1.0
        sigmas = [_sample_sigma(x) for x in (b, t) if len(x) >= 2]
        sigma = max(sigmas) if sigmas else params.single_seed_sigma * scale
        worse = -sign * (mean_t - mean_b) / scale
        rel_sigma = sigma / scale
        frac = min(1.0, mark / budget_tokens)
        margin = ep.floor + ep.slack * (1.0 - frac)
        hit = worse > ep.z * rel_sigma + margin
        run = run + 1 if hit else 0
        if run >= ep.consecutive:
            z = worse / rel_sigma if rel_sigma > 0 else math.inf
            return EarlyStop(
                tokens=mark,
                reason=(
                    f"{primary.metric} at {mark:,} tokens ({mark / budget_tokens:.0%} of the "
                    f"budget): {_num(mean_t)} vs baseline {_num(mean_b)} "
                    f"({_pct(-sign * worse, signed=True)}), worse by {z:.1f}σ of seed noise "
                    f"(> {ep.z:g}σ + {_pct(margin)}) at {ep.consecutive} consecutive marks"
                ),
                z=z,
                budget_tokens=budget_tokens,
            )
    return None
