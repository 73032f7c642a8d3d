"""The verdict on one hypothesis: confirmed, rejected or inconclusive against the baseline.

A hypothesis changes one variable and is run as short jobs with the same k seeds as the recorded
baseline (seed s of the test pairs with seed s of the baseline). Both sides are read at MATCHED
TOKENS: the largest token count every baseline and every test run reached, each run's value being
the one logged at the largest step <= that count (for per-step noisy metrics such as
perf/tokens_per_s: the median over the last 25% of the tokens up to it; `MetricSpec.window`).
So a batch-size change is compared at the same tokens, not the same steps.

The rule, in the order `compare` takes its steps (numbers in diag/tables/verdict.yaml; defaults
in brackets):

1. Matched value (`matched_value`, `matched_values`): each seed's value at the matched tokens.
2. Noise (`contrast`). sigma_b = sample std of the baseline's per-seed values (ddof 1, needs
   >= 2 seeds; with one seed an assumed relative sigma [single_seed_sigma 0.5%], said so in the
   reason). sigma_t = the test's sample std with >= 2 test seeds, else sigma_b. The noise of the
   difference of seed means is sigma_diff = sqrt(sigma_b^2/n_b + sigma_t^2/n_t); `noise` is it
   relative to |baseline mean|, `effect` the relative improvement (direction-aware: positive =
   better), z = effect / noise.
3. Small-sample threshold (`z_threshold`) [small_sample true]. With 2-5 seeds sigma is itself a
   noisy estimate, so the z thresholds are replaced by the Student-t quantile with the same
   one-sided confidence (z_confirm 2.0 -> 97.7%) at the noise's degrees of freedom (`null_df`):
   Welch-Satterthwaite at the one spread both sides share under the null a confirmation must
   rule out, so both sides' seeds count (2n - 2 at n per side, Student's two-sample t; n_b - 1
   when the test borrows sigma_b; normal when sigma is assumed). At 3 vs 3 seeds that is 2.9
   sigma; without it an A/A comparison "confirms" 6-7% of the time instead of about 2%.
   Welch's df from the two sample spreads (used until issue 25) fell to n - 1 whenever they
   differed by chance: at 2 seeds per side a t at 1 df, under which a -48% fix at z = 50 was
   not significant at a first look. `Verdict.z_needed` is the threshold used. Distributions
   are scipy's.
4. Paired check (`paired_check`) over the seeds present on both sides: d_s = test_s -
   baseline_s, t = mean(d) / (sd(d)/sqrt(n)), df = n - 1, two-sided p. Reported always
   (n >= 2); with >= paired_min_seeds [3] common seeds its sign must agree with the improvement
   before a confirmation.
5. Guards (`guard_check`): a metric that must not get worse (e.g. perf/tokens_per_s while
   testing eval/loss) REGRESSES when it is worse than the baseline by more than z_guard [2.0] x
   its noise (same correction) AND by more than a relative floor [guard_floor 1%, or the
   guard's own min_effect].
6. Decision (`decision`):
   - rejected: a guard regressed; or the test is worse beyond noise (effect < -z_needed x
     noise); or even the upper bound of the improvement, effect + z_needed x noise, is below
     min_effect (it cannot be the effect we want).
   - confirmed: effect > min_effect AND effect > z_needed x noise, no guard regressed, and the
     paired comparison (when available) agrees in sign.
   - inconclusive: anything else. `seeds_needed` then estimates the seeds per side that would
     separate delta = min_effect (or the measured effect when min_effect is 0) from seed noise:
     n ~ 2 (z sigma / delta)^2 with sigma the relative per-seed sigma, raised until the
     small-sample threshold at 2n - 2 degrees of freedom is also met.

Before those steps, two cases are settled on their own. A test run that diverged (NaN/inf in the
primary metric, or `diverged=True`) is rejected. Against a diverged baseline (a baseline seed
reached NaN/inf in the primary, or the caller says it diverged, e.g. before its first point)
nothing finite can be matched, so the question is whether the divergence goes away
(`against_diverged`): a test that diverges too is rejected; one whose every seed trains past the
point where the baseline blew up, finite, is confirmed ("removes the divergence") when every
baseline seed diverged, and inconclusive when some stayed finite (one seed's divergence flipping
can be chance).

Seeds in rounds. With a sequential `design` (diag/sequential.py) the thresholds of step 6 are
that look's group-sequential boundaries instead of z_confirm: z_needed on the confirm side, and
z_reject for the interval whose upper end decides a rejection (with a single look both are
z_confirm, the rule above). Before the design's last look `inconclusive` means "run the next
round"; `Verdict.final` says whether one may follow. A test whose every seed's curve equals the
baseline seed's bit for bit is rejected as "no effect (identical to baseline)" whatever the
look: the change does nothing to the metric, and more seeds cannot show an effect.

Early rejection (`early_reject`, for tests still running) is the reject side of the round's look
taken at held-out marks: at marks at or after early.min_frac [30%] of the token budget, the upper
end of the improvement's interval there, effect + z_reject x noise (the noise of the difference
of seed means at that mark, z_reject t-corrected at its degrees of freedom), is below
-(early.floor [1%] + early.slack [5%] x (1 - f)) at budget fraction f (a curve that is worse
early and better late has the most room to catch up early), at early.consecutive [2]
consecutive marks. A diverged test is stopped at once. It only ever rejects, so it adds no false
confirmation, and at f = 1 it is stricter than the look's own reject rule (below -1% rather than
below min_effect). Caveat: a hypothesis whose gain comes only at the end BY CONSTRUCTION (a
schedule change such as WSD, whose stable phase sits above a cosine baseline until its decay)
can trail by more than that margin mid-run; pass `min_frac` near 1 (or skip early_reject) for
such hypotheses.

Everything here is a pure function over numbers: no tracking, config or training imports.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass as checked_dataclass

from hyprun.diag.metric import MetricSpec
from hyprun.diag.sequential import Design, Spending

__all__ = ["MetricSpec", "compare", "early_reject", "load_params"]

Points = list[tuple[int, float]]
"""(tokens seen, value) pairs: one metric's history in one run, in any order."""

Runs = Mapping[int, Points]
"""seed -> that seed's history of one metric."""

TABLE = Path(__file__).parent / "tables" / "verdict.yaml"
"""The shipped thresholds."""

STATUSES = ("confirmed", "rejected", "inconclusive")
SPENDING_NAMES = {
    "obrien_fleming": "O'Brien-Fleming",
    "pocock": "Pocock",
    "hwang_shih_decani": "Hwang-Shih-DeCani",
}


def _special():
    """scipy.special, imported on first use (commands that never judge a test, such as status
    and report, should not pay for scipy's import). Its ndtr/ndtri/stdtr/stdtrit are the normal
    and Student-t functions scipy.stats' `norm` and `t` evaluate, called directly: the stats
    objects add a third of a millisecond per call, which the benchmark's 30,000 verdicts feel."""
    from scipy import special

    return special


# ---------------------------------------------------------------------------------------------
# Parameters: diag/tables/verdict.yaml, checked by pydantic

STRICT = ConfigDict(extra="forbid")


@checked_dataclass(frozen=True, config=STRICT)
class EarlyParams:
    """Thresholds of early rejection (`early:` in verdict.yaml)."""

    min_frac: float = Field(0.3, ge=0, le=1)
    """Judge only marks at or after this fraction of the token budget."""
    floor: float = Field(0.01, ge=0)
    """Relative margin beyond the reject boundary (a tiny sigma must not make 0.1% count as
    worse)."""
    slack: float = Field(0.05, ge=0)
    """Further relative margin per unit of budget still to run: slack x (1 - f) at fraction f
    (early in the run a late-improving curve has the most room to catch up)."""
    consecutive: int = Field(2, ge=1)
    """How many consecutive marks must be worse before stopping."""


@checked_dataclass(frozen=True, config=STRICT)
class SequentialParams:
    """How an undecided test adds seeds (`sequential:` in verdict.yaml; diag/sequential.py)."""

    max_seeds: int = Field(8, ge=1)
    """Seeds per side a test may grow to (`hyprun test --max-seeds`); the baseline's count
    or less: the fixed-k rule, one look."""
    round_seeds: int = Field(0, ge=0)
    """Seeds per side added each round (0: as many as the baseline was recorded with)."""
    confirm_spending: Spending = "hwang_shih_decani"
    """Spending function of the confirm side: Hwang-Shih-DeCani (gamma -4) keeps early looks
    strict and the last look close to the fixed rule's z, as O'Brien-Fleming type does, but
    spends enough at the first look to confirm a huge effect there."""
    reject_spending: Spending = "pocock"
    """Spending function of the reject side: Pocock type spends evenly, so a test that cannot
    reach its min effect stops in an early round."""


@checked_dataclass(frozen=True, config=STRICT)
class VerdictParams:
    """The numbers of the verdict rule (`verdict:` in verdict.yaml)."""

    z_confirm: float = Field(2.0, gt=0)
    """Improvement must exceed this many noise units (before the small-sample correction)."""
    small_sample: bool = True
    """Replace z thresholds by the Student-t quantile of equal confidence at the noise's df."""
    single_seed_sigma: float = Field(0.005, gt=0)
    """Relative per-seed sigma assumed when the baseline has one seed."""
    z_guard: float = Field(2.0, gt=0)
    """A guard worse than baseline by more than this many noise units (and the floor) regressed."""
    guard_floor: float = Field(0.01, ge=0)
    """Relative regression a guard may show without counting (unless its min_effect > 0)."""
    paired_min_seeds: int = Field(3, ge=2)
    """Common seeds from which the paired comparison must agree in sign to confirm."""
    windows: dict[str, float] = Field(default_factory=lambda: {"perf/": 0.25})
    """Metric-name prefix -> median window (fraction of tokens) for per-step noisy metrics."""
    max_seeds: int = Field(64, ge=2)
    """Cap of the seeds-needed estimate."""
    early: EarlyParams = Field(default_factory=EarlyParams)
    """Early-rejection thresholds."""
    sequential: SequentialParams = Field(default_factory=SequentialParams)
    """Seeds in rounds for undecided tests (diag/sequential.py)."""

    @property
    def alpha(self) -> float:
        """The one-sided false-confirmation rate z_confirm stands for: P(Z > z_confirm)."""
        return float(_special().ndtr(-self.z_confirm))


@checked_dataclass(frozen=True, config=STRICT)
class VerdictTable:
    """The file: one top-level `verdict:` mapping (not `patterns:`, so triage skips it)."""

    verdict: VerdictParams


def _one_line(path: str | Path, error: ValidationError) -> str:
    """A pydantic error as one line naming the file, the entry and the field."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    if first["type"] == "unexpected_keyword_argument":
        entry = {
            "": VerdictTable,
            "verdict": VerdictParams,
            "verdict.early": EarlyParams,
            "verdict.sequential": SequentialParams,
        }
        known = sorted(entry[where.rpartition(".")[0]].__dataclass_fields__)
        return f"{path}: unknown key {where}; known: {known}"
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{path}: {where}: {first['msg']}, got {first.get('input')!r}{more}"


@functools.cache
def load_params(path: str | Path = TABLE) -> VerdictParams:
    """The `verdict:` table of a YAML file (read once per process and path). A typo or a bad
    value is a one-line ValueError naming file, entry and field, so it cannot silently fall
    back to a default."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("verdict"), dict):
        raise ValueError(f"{path}: needs a top-level `verdict:` mapping")
    try:
        return VerdictTable(**data).verdict
    except ValidationError as error:
        raise ValueError(_one_line(path, error)) from None


# ---------------------------------------------------------------------------------------------
# Outputs


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
    z_reject: float = math.nan
    """The z of the reject side's interval (z_needed too, with a single look)."""
    round: int = 1
    """Which look of the sequential design this is (1 = the first seeds)."""
    rounds: int = 1
    """Looks the design plans at most (1: the fixed-k rule)."""
    final: bool = True
    """Whether no further round may follow: an inconclusive verdict then stands."""
    identical: bool = False
    """Every test seed's primary curve equals the baseline seed's, point for point."""

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
# Step 1: the matched value


def _sorted(points: Points) -> list[tuple[int, float]]:
    return sorted(((int(step), float(value)) for step, value in points), key=lambda p: p[0])


def matched_value(points: Points, tokens: int, window: float = 0.0) -> float | None:
    """The value at the largest step <= `tokens` (None when no step is). With `window` > 0 the
    median of the values logged in [(1 - window) * tokens, tokens] (falling back to that single
    value when the window holds none): the level of a per-step noisy metric such as
    perf/tokens_per_s. A NaN/inf value is returned as it is (divergence shows)."""
    upto = [p for p in _sorted(points) if p[0] <= tokens]
    if not upto:
        return None
    if window > 0:
        start = (1.0 - window) * tokens
        inside = [value for step, value in upto if step >= start]
        if inside:
            return float(np.median(inside))
    return upto[-1][1]


def matched_values(
    runs: Runs, tokens: int, window: float, metric: str, side: str
) -> dict[int, float]:
    """{seed: matched value} of every run; a run with no finite value there is a ValueError."""
    values = {}
    for seed, points in runs.items():
        value = matched_value(points, tokens, window)
        if value is None:
            raise ValueError(f"{side} seed {seed}: no {metric} logged at or before {tokens} tokens")
        if not math.isfinite(value):
            raise ValueError(f"{side} seed {seed}: {metric} is {value} at {tokens} tokens")
        values[int(seed)] = value
    return values


def window_for(spec: MetricSpec, params: VerdictParams) -> float:
    """The median window a metric is read with: its own, else the table's by name prefix."""
    if spec.window is not None:
        return spec.window
    for prefix, window in params.windows.items():
        if spec.metric.startswith(prefix):
            return float(window)
    return 0.0


def last_finite_step(points: Points) -> int | None:
    """The last token count at which the run logged a finite value."""
    steps = [step for step, value in _sorted(points) if math.isfinite(value)]
    return steps[-1] if steps else None


def has_nonfinite(points: Points) -> bool:
    return any(not math.isfinite(float(value)) for _, value in points)


def matched_tokens(baseline: Runs, test: Runs, metric: str) -> int:
    """The largest token count every run reached with a finite value."""
    ends = [last_finite_step(points) for points in [*baseline.values(), *test.values()]]
    if any(end is None for end in ends):
        raise ValueError(f"compare: a run has no finite {metric} value")
    return min(ends)


def identical_curves(baseline: Runs, test: Runs) -> bool:
    """Every test seed ran as its baseline seed did, bit for bit: the change did nothing to
    this metric, and no number of seeds will show an effect."""
    return all(
        seed in baseline and _sorted(points) == _sorted(baseline[seed])
        for seed, points in test.items()
    )


# ---------------------------------------------------------------------------------------------
# Step 2: the noise of the difference of seed means


@dataclass(frozen=True)
class Contrast:
    """Test vs baseline seed means at one token mark, and the noise of their difference."""

    mean_b: float
    mean_t: float
    sigma_b: float
    """Per-seed sigma of the baseline (metric units; assumed when single seed)."""
    sigma_t: float
    """Per-seed sigma of the test (the baseline's when the test has one seed)."""
    scale: float
    """|baseline mean| (1 when it is 0): the denominator of the relative numbers."""
    effect: float
    """Relative improvement (direction-aware: positive = better)."""
    effect_abs: float
    """Test mean - baseline mean, metric units."""
    noise: float
    """Relative sigma of the difference of means."""
    z: float
    df: float
    """Degrees of freedom of the noise (null_df; inf when sigma was assumed)."""
    assumed: bool
    """True when sigma_b is the single-seed assumption."""


def ratio(num: float, den: float) -> float:
    """num / den, with +-inf for a nonzero num over 0 and 0 for 0 / 0."""
    if den > 0:
        return num / den
    return math.copysign(math.inf, num) if num else 0.0


def sample_sigma(values: Sequence[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) >= 2 else math.nan


def better_sign(spec: MetricSpec) -> float:
    """+1 when higher is better, -1 when lower is: multiplies a change into an improvement."""
    return 1.0 if spec.direction == "max" else -1.0


def welch_df(var_b: float, df_b: float, var_t: float, df_t: float) -> float:
    """Welch-Satterthwaite degrees of freedom of var_b + var_t (an assumed part counts as
    exact: infinite df)."""
    parts = [(var_b, df_b), (var_t, df_t)]
    den = sum(var * var / df for var, df in parts if math.isfinite(df))
    return (var_b + var_t) ** 2 / den if den > 0 else math.inf


def null_df(n_b: int, n_t: int) -> float:
    """Degrees of freedom of the noise under the null a confirmation must rule out (the change
    does nothing, so both sides' seeds share one spread): Welch-Satterthwaite at that common
    spread, counting the seeds of both sides (2n - 2 at n per side: Student's two-sample t,
    whose noise equals Welch's at equal seed counts). Welch's df from the two sample spreads
    instead falls towards n - 1 whenever they differ by chance, as two spreads of 2 seeds
    nearly always do: at 2 seeds per side, a t at 1 df, with tails so heavy that a 48% fix at
    z = 50 could not be confirmed at a first look."""
    return welch_df(1.0 / n_b, n_b - 1.0, 1.0 / n_t, n_t - 1.0)


def contrast(
    spec: MetricSpec, base: Mapping[int, float], test: Mapping[int, float], params: VerdictParams
) -> Contrast:
    """Seed means, per-seed sigmas and the noise of the difference of means (step 2)."""
    base_values, test_values = list(base.values()), list(test.values())
    n_b, n_t = len(base_values), len(test_values)
    mean_b, mean_t = float(np.mean(base_values)), float(np.mean(test_values))
    scale = abs(mean_b) or 1.0
    assumed = n_b < 2
    sigma_b = params.single_seed_sigma * scale if assumed else sample_sigma(base_values)
    df_b = math.inf if assumed else n_b - 1.0
    if n_t < 2:  # the test borrows the baseline's sigma: one estimate, its df
        sigma_t, df = sigma_b, df_b
    elif assumed:  # only the test's spread is measured
        sigma_t = sample_sigma(test_values)
        df = welch_df(sigma_b**2 / n_b, df_b, sigma_t**2 / n_t, n_t - 1.0)
    else:
        sigma_t, df = sample_sigma(test_values), null_df(n_b, n_t)
    effect_abs = mean_t - mean_b
    effect = better_sign(spec) * effect_abs / scale
    noise = math.sqrt(sigma_b**2 / n_b + sigma_t**2 / n_t) / scale
    return Contrast(
        mean_b=mean_b,
        mean_t=mean_t,
        sigma_b=sigma_b,
        sigma_t=sigma_t,
        scale=scale,
        effect=effect,
        effect_abs=effect_abs,
        noise=noise,
        z=ratio(effect, noise),
        df=df,
        assumed=assumed,
    )


# ---------------------------------------------------------------------------------------------
# Step 3: the small-sample threshold


@functools.lru_cache(maxsize=4096)
def _t_quantile(confidence: float, df: float) -> float:
    return float(_special().stdtrit(df, confidence))


def z_threshold(z: float, df: float, small_sample: bool = True) -> float:
    """`z` as a threshold on effect/noise when the noise has `df` degrees of freedom: the t
    quantile of the same one-sided confidence as z under the normal (z itself when df is inf or
    the correction is off)."""
    if not small_sample or math.isinf(df) or z <= 0:
        return z
    confidence = float(_special().ndtr(z))
    return _t_quantile(confidence, round(float(df), 6))


def bonferroni_z(z: float, looks: int) -> float:
    """The one-sided z whose tail is z's tail divided by `looks`: confirming the best of `looks`
    candidates is then no likelier by chance than confirming one."""
    if looks <= 1:
        return z
    special = _special()
    return float(-special.ndtri(special.ndtr(-z) / looks))


# ---------------------------------------------------------------------------------------------
# Step 4: the paired check


def paired_check(
    spec: MetricSpec,
    base: Mapping[int, float],
    test: Mapping[int, float],
    scale: float,
    params: VerdictParams,
) -> dict | None:
    """The per-seed differences over the seeds both sides ran (None below 2 of them)."""
    seeds = sorted(set(base) & set(test))
    if len(seeds) < 2:
        return None
    n = len(seeds)
    differences = np.array([test[s] - base[s] for s in seeds], dtype=float)
    mean, sd = float(differences.mean()), float(differences.std(ddof=1))
    better = better_sign(spec) * mean
    if sd <= 1e-12 * max(abs(mean), scale):  # equal differences up to rounding
        sd = 0.0
    t = ratio(better, sd / math.sqrt(n))
    p = 2.0 * float(_special().stdtr(n - 1, -abs(t))) if not math.isnan(t) else math.nan
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
# Step 5: guards


def guard_check(
    guard: MetricSpec,
    baseline: Runs,
    test: Runs,
    tokens: int,
    params: VerdictParams,
) -> dict:
    """One guard at the primary's matched tokens: did it regress beyond noise and its floor?"""
    window = window_for(guard, params)
    result = contrast(
        guard,
        matched_values(baseline, tokens, window, guard.metric, "baseline"),
        matched_values(test, tokens, window, guard.metric, "test"),
        params,
    )
    z_needed = z_threshold(params.z_guard, result.df, params.small_sample)
    floor = guard.min_effect if guard.min_effect > 0 else params.guard_floor
    regressed = result.effect < -z_needed * result.noise and result.effect < -floor
    return {
        "metric": guard.metric,
        "direction": guard.direction,
        "baseline": result.mean_b,
        "test": result.mean_t,
        "effect": result.effect,
        "effect_abs": result.effect_abs,
        "noise": result.noise,
        "z": result.z,
        "z_needed": z_needed,
        "floor": floor,
        "regressed": bool(regressed),
        "summary": summary(guard.metric, result),
    }


def guard_rows(
    guards: Sequence[MetricSpec],
    baseline_guards: Mapping[str, Runs] | None,
    test_guards: Mapping[str, Runs] | None,
    tokens: int,
    params: VerdictParams,
) -> list[dict]:
    rows = []
    for guard in guards:
        baseline = (baseline_guards or {}).get(guard.metric)
        test = (test_guards or {}).get(guard.metric)
        if not baseline or not test:
            raise ValueError(
                f"guard {guard.metric}: pass its histories in baseline_guards and test_guards "
                "(metric -> seed -> points)"
            )
        rows.append(guard_check(guard, baseline, test, tokens, params))
    return rows


# ---------------------------------------------------------------------------------------------
# Formatting


def _num(x: float) -> str:
    if not math.isfinite(x):
        return str(x)
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _pct(x: float, signed: bool = False) -> str:
    if not math.isfinite(x):
        return str(x)
    percent = 100.0 * x
    text = f"{percent:.0f}" if abs(percent) >= 100 else f"{percent:.2g}"
    if "e" in text:
        text = f"{percent:.1e}"
    return f"+{text}%" if signed and percent > 0 else f"{text}%"


def _zs(z: float) -> str:
    return f"{z:.1f}" if math.isfinite(z) else ("inf" if z > 0 else "-inf")


def summary(metric: str, result: Contrast) -> str:
    """`eval/loss 3.412 -> 3.287 (-3.7% ± 0.4%, z=9.1)`: change as measured, noise, z."""
    change = result.effect_abs / result.scale
    return (
        f"{metric} {_num(result.mean_b)} -> {_num(result.mean_t)} "
        f"({_pct(change, signed=True)} ± {_pct(result.noise)}, z={_zs(result.z)})"
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
# Step 6: the decision


@dataclass(frozen=True)
class Threshold:
    """The z an effect must clear to confirm, the z of the reject side's interval, and how
    they were reached (for the reason line)."""

    z_needed: float
    z_reject: float
    z_confirm: float
    """The confirm side's z after the looks corrections, before the small-sample one."""
    df: float
    looks: int = 1
    z_table: float = 2.0
    """The table's z_confirm."""
    round: int = 1
    rounds: int = 1
    spending: str = ""

    @property
    def final(self) -> bool:
        return self.round >= self.rounds

    def describe(self) -> str:
        text = f"{self.z_needed:.2g}σ noise"
        if self.z_needed != self.z_confirm:
            text += f" (z {self.z_confirm:.3g} at {self.df:.1f} df)"
        if self.looks > 1 and self.rounds > 1:
            text += f"; Bonferroni: best of {self.looks} trials, alpha / {self.looks}"
        elif self.looks > 1:
            text += (
                f"; Bonferroni: best of {self.looks} trials, z {self.z_table:g} -> "
                f"{self.z_confirm:.3g}"
            )
        if self.rounds > 1:
            text += f"; round {self.round} of {self.rounds}, {self.spending} spending"
        return text

    def describe_reject(self) -> str:
        if self.z_reject == self.z_needed:
            return self.describe()
        return f"{self.z_reject:.2g}σ noise (round {self.round} of {self.rounds})"


def confirm_threshold(
    df: float, looks: int, params: VerdictParams, design: Design | None = None, look: int = 0
) -> Threshold:
    """z_confirm, raised for `looks` candidates (Bonferroni) and for few seeds (Student t); in
    a sequential design, the boundaries of its look `look` (0-based; diag/sequential.py)."""
    z_confirm = bonferroni_z(params.z_confirm, looks)
    if design is None or len(design.seeds) == 1:
        z_needed = z_threshold(z_confirm, df, params.small_sample)
        return Threshold(z_needed, z_needed, z_confirm, df, looks, params.z_confirm)
    z_confirm = design.confirm_z(look)
    z_reject = design.reject_z(look)
    return Threshold(
        z_needed=z_threshold(z_confirm, df, params.small_sample),
        z_reject=z_threshold(z_reject, df, params.small_sample),
        z_confirm=z_confirm,
        df=df,
        looks=looks,
        z_table=params.z_confirm,
        round=look + 1,
        rounds=len(design.seeds),
        spending=SPENDING_NAMES[design.confirm_spending],
    )


def seeds_needed(
    result: Contrast, spec: MetricSpec, params: VerdictParams, n_b: int, n_t: int
) -> str:
    """What would decide an inconclusive verdict: seeds per side for delta vs seed noise."""
    sigma = math.sqrt((result.sigma_b**2 + result.sigma_t**2) / 2.0) / result.scale
    delta = spec.min_effect if spec.min_effect > 0 else abs(result.effect)
    label = "min effect" if spec.min_effect > 0 else "measured effect"
    if delta <= 0:
        return (
            "no effect measured and min_effect is 0: set a min_effect to say which effect "
            "more seeds should resolve"
        )
    z = params.z_confirm
    if sigma <= 0:
        return (
            f"seed noise is 0 here; rerun with min_effect below the {_pct(result.effect)} measured"
        )
    normal_n = max(2, math.ceil(2.0 * (z * sigma / delta) ** 2))
    n = normal_n
    while n <= params.max_seeds:
        if delta > z_threshold(z, 2.0 * n - 2.0, params.small_sample) * sigma * math.sqrt(2.0 / n):
            break
        n += 1
    if n > params.max_seeds:
        return (
            f"more than {params.max_seeds} seeds per side would be needed to separate a "
            f"{_pct(delta)} {label} from seed noise (σ={_pct(sigma)} per seed): lengthen the "
            "token budget or drop the hypothesis"
        )
    raised = ", raised for the few-seed t correction" if n > normal_n else ""
    return (
        f"about {n} seeds per side (now {n_b}/{n_t}) would separate a {_pct(delta)} {label} "
        f"from seed noise (σ={_pct(sigma)} per seed; n ≈ 2(zσ/δ)² with z={z:g}{raised})"
    )


@dataclass(frozen=True)
class Decision:
    status: str
    reason: str
    decide: str | None = None


def decision(
    result: Contrast,
    spec: MetricSpec,
    threshold: Threshold,
    paired: dict | None,
    guards: list[dict],
    params: VerdictParams,
    n_b: int,
    n_t: int,
) -> Decision:
    """Step 6: the status from the numbers of steps 2-5 (rule: module docstring). Before the
    last round of a sequential design, `inconclusive` means: run the next round."""
    text = summary(spec.metric, result)
    min_effect = _pct(spec.min_effect)
    confirm_bound = threshold.z_needed * result.noise
    reject_bound = threshold.z_reject * result.noise
    regressed = [g for g in guards if g["regressed"]]
    if regressed:
        reason = "; ".join(
            f"guard {g['summary']} regressed beyond {_pct(g['floor'])} and {g['z_needed']:.2g}σ"
            for g in regressed
        )
        return Decision("rejected", f"{reason}; primary {text}")
    if result.effect < -reject_bound:
        return Decision(
            "rejected", f"{text}: worse than baseline beyond {threshold.describe_reject()}"
        )
    if result.effect + reject_bound < spec.min_effect:
        upper = _pct(result.effect + reject_bound)
        return Decision(
            "rejected",
            f"{text}: improvement at most {upper} at {threshold.describe_reject()}, below min "
            f"effect {min_effect}",
        )
    more = seeds_needed(result, spec, params, n_b, n_t) if threshold.final else "the next round"
    if result.effect > spec.min_effect and result.effect > confirm_bound:
        if paired is not None and paired["available"] and not paired["agrees"]:
            return Decision(
                "inconclusive",
                f"{text}: beyond min effect {min_effect} and {threshold.describe()}, but the "
                f"paired comparison over {paired['n']} common seeds disagrees in sign "
                f"(t={_zs(paired['t'])})",
                "rerun with the same seeds on both sides; " + more,
            )
        reason = f"{text} beyond min effect {min_effect} and {threshold.describe()}"
        if paired is not None and paired["available"]:
            reason += f"; paired over {paired['n']} seeds t={_zs(paired['t'])}"
        return Decision("confirmed", reason)
    if result.effect <= confirm_bound:
        why = f"within {threshold.describe()}"
    else:
        why = f"beyond noise but below min effect {min_effect}, which it may still reach"
    return Decision("inconclusive", f"{text}: {why}", more)


def no_effect(result: Contrast, spec: MetricSpec, n_t: int) -> Decision:
    """A test whose curves equal the baseline's: the change does nothing to this metric."""
    return Decision(
        "rejected",
        f"no effect (identical to baseline): {spec.metric} of every test seed ({n_t}) equals "
        f"the baseline seed's at every logged step ({_num(result.mean_b)})",
    )


# ---------------------------------------------------------------------------------------------
# Diverged runs


def _diverged_verdict(
    status: str, reason: str, tokens: int, primary: MetricSpec, n_b: int, n_t: int, decide=None
) -> Verdict:
    """A verdict with no finite numbers to report (a divergence on either side)."""
    return Verdict(
        status=status,
        effect=math.nan,
        effect_abs=math.nan,
        noise=math.nan,
        z=math.nan,
        tokens=int(tokens),
        n_baseline=n_b,
        n_test=n_t,
        paired=None,
        guards=[],
        reason=reason,
        decide=decide,
        metric=primary.metric,
    )


def where_blown(points: Points) -> int:
    """Where a diverged run blew up: its first NaN/inf point, else its last point."""
    nonfinite = [step for step, value in points if not math.isfinite(value)]
    return min(nonfinite, default=max((step for step, _ in points), default=0))


def against_diverged(
    baseline: Runs,
    test: Runs,
    primary: MetricSpec,
    blown: list[int],
    bad: list[int],
    diverged: bool,
    unit: str = "tokens",
) -> Verdict:
    """The verdict against a baseline that diverged: the question is no longer "better at
    matched tokens" (there is nothing finite to match) but "does the divergence go away".
    `unit`: what the curves' steps count, as the reason names them."""
    n_b, n_t = len(baseline), len(test)
    where = max(where_blown(baseline[seed]) for seed in blown)
    reached = min((last_finite_step(points) or 0) for points in test.values())
    base = (
        f"{primary.metric} went NaN/inf in baseline seed(s) {', '.join(map(str, blown))} "
        f"of {n_b} (by {where:,} {unit})"
    )
    if diverged or bad:
        who = f"test seed(s) {', '.join(map(str, bad))}" if bad else "the test (marked)"
        reason = f"diverged: {who} too, as {base}"
        return _diverged_verdict("rejected", reason, reached, primary, n_b, n_t)
    if reached <= where:
        return _diverged_verdict(
            "inconclusive",
            f"{base}; the test stopped at {reached:,} {unit}, before that point",
            reached,
            primary,
            n_b,
            n_t,
            "run the test to the baseline's budget",
        )
    if len(blown) < n_b:
        return _diverged_verdict(
            "inconclusive",
            f"{base}, in no test seed: with other baseline seeds "
            "finite, a removed divergence cannot be told from chance",
            reached,
            primary,
            n_b,
            n_t,
            "record a baseline with more seeds (every one diverging)",
        )
    return _diverged_verdict(
        "confirmed",
        f"removes the divergence: {base}; every test seed trained to "
        f"{reached:,} {unit} with a finite {primary.metric}",
        reached,
        primary,
        n_b,
        n_t,
    )


def rejected_as_diverged(
    baseline: Runs, test: Runs, primary: MetricSpec, bad: list[int], diverged: bool
) -> Verdict:
    """A test seed reached NaN/inf (or the caller says the test diverged): rejected."""
    finite = {seed: points for seed, points in test.items() if seed not in bad}
    tokens = matched_tokens(baseline, finite, primary.metric)
    who = (
        f"test seed(s) {', '.join(map(str, bad))} reached NaN/inf in {primary.metric}"
        if bad
        else "the test was marked diverged by the caller"
    )
    return _diverged_verdict(
        "rejected", f"diverged: {who}", tokens, primary, len(baseline), len(test)
    )


# ---------------------------------------------------------------------------------------------
# compare: the steps in order


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
    design: Design | None = None,
    params: VerdictParams | None = None,
    unit: str = "tokens",
) -> Verdict:
    """The verdict on `test` against `baseline` for the `primary` metric (rule: module docstring).

    `baseline` and `test` map seed -> the primary metric's history (tokens, value) in that run.
    `guards` are metrics that must not regress; their histories are `baseline_guards[metric]`
    and `test_guards[metric]`, each again seed -> points, read at the primary's matched tokens.
    `diverged=True` marks the test as diverged (a NaN/inf in the primary is detected anyway);
    `baseline_diverged` names baseline seeds that diverged, e.g. before their first point.
    `looks` > 1: `test` is the best of that many tried (a sweep); z_confirm is raised to keep the
    family-wise false-confirmation rate at one look's (Bonferroni, bonferroni_z).
    `design`: the test's sequential design (diag/sequential.py); the look is the one taken with
    the test's seed count. None: the fixed-k rule, one look.
    `params` overrides the table (default: diag/tables/verdict.yaml).
    `unit`: what the histories' steps count (an app's metric may count steps), as reasons say.
    """
    params = params or load_params()
    if not baseline:
        raise ValueError("compare: no baseline runs")
    if not test:
        raise ValueError("compare: no test runs")
    blown = {s for s, points in baseline.items() if has_nonfinite(points)} | set(baseline_diverged)
    for seed, points in baseline.items():
        if not points and seed not in blown:
            raise ValueError(f"baseline seed {seed}: no {primary.metric} points")
    bad = sorted(s for s, points in test.items() if has_nonfinite(points))
    if blown:
        return against_diverged(baseline, test, primary, sorted(blown), bad, diverged, unit)
    if diverged or bad:
        return rejected_as_diverged(baseline, test, primary, bad, diverged)

    tokens = matched_tokens(baseline, test, primary.metric)
    window = window_for(primary, params)
    base_values = matched_values(baseline, tokens, window, primary.metric, "baseline")
    test_values = matched_values(test, tokens, window, primary.metric, "test")
    result = contrast(primary, base_values, test_values, params)
    n_b, n_t = len(base_values), len(test_values)
    look = design.look_at(n_t) if design is not None else 0
    threshold = confirm_threshold(result.df, looks, params, design, look)
    paired = paired_check(primary, base_values, test_values, result.scale, params)
    guard_results = guard_rows(guards, baseline_guards, test_guards, tokens, params)
    identical = identical_curves(baseline, test)
    if identical:
        outcome = no_effect(result, primary, n_t)
    else:
        outcome = decision(result, primary, threshold, paired, guard_results, params, n_b, n_t)
    reason = outcome.reason
    if result.assumed:
        reason += (
            f"; 1 baseline seed: seed noise assumed {_pct(params.single_seed_sigma)} per seed "
            "(verdict.yaml single_seed_sigma)"
        )
    return Verdict(
        status=outcome.status,
        effect=result.effect,
        effect_abs=result.effect_abs,
        noise=result.noise,
        z=result.z,
        tokens=int(tokens),
        n_baseline=n_b,
        n_test=n_t,
        paired=paired,
        guards=guard_results,
        reason=reason,
        decide=outcome.decide,
        metric=primary.metric,
        baseline_value=result.mean_b,
        test_value=result.mean_t,
        z_needed=threshold.z_needed,
        df=result.df,
        looks=looks,
        baseline_sigma=result.sigma_b,
        test_sigma=result.sigma_t,
        z_reject=threshold.z_reject,
        round=threshold.round,
        rounds=threshold.rounds,
        final=threshold.final,
        identical=identical,
    )


# ---------------------------------------------------------------------------------------------
# Early rejection


def diverged_stop(
    partial_test: Runs, primary: MetricSpec, bad: list[int], budget: int
) -> EarlyStop:
    """Stop a diverged test at its first NaN/inf mark (or its latest mark when marked)."""
    first_bad = [
        int(s) for points in partial_test.values() for s, v in points if not math.isfinite(v)
    ]
    latest = max((int(s) for points in partial_test.values() for s, _ in points), default=0)
    who = f"test seed(s) {', '.join(map(str, bad))}" if bad else "the test (marked)"
    return EarlyStop(
        tokens=min(first_bad) if first_bad else latest,
        reason=f"diverged: {who} reached NaN/inf in {primary.metric}",
        z=math.inf,
        budget_tokens=budget,
    )


def marks_to_judge(baseline: Runs, partial_test: Runs, start: float) -> list[int]:
    """The test's token marks from `start` up to the latest one every run reached."""
    ends = [last_finite_step(points) for points in [*baseline.values(), *partial_test.values()]]
    if any(end is None for end in ends):
        return []
    common = min(ends)
    steps = {int(s) for points in partial_test.values() for s, _ in points}
    return sorted(step for step in steps if start <= step <= common)


@dataclass(frozen=True)
class MarkCheck:
    """How much worse the test is at one mark, against the reject boundary there."""

    mark: int
    result: Contrast
    z_reject: float
    """The reject side's z at this look, t-corrected at the mark's degrees of freedom."""
    margin: float
    """Relative margin for the budget still to run: floor + slack (1 - f)."""

    @property
    def hit(self) -> bool:
        """Even the upper end of the improvement's interval is below -margin."""
        return self.result.effect + self.z_reject * self.result.noise < -self.margin


def worse_at_mark(
    baseline: Runs,
    partial_test: Runs,
    primary: MetricSpec,
    mark: int,
    budget: int,
    params: VerdictParams,
    design: Design | None,
) -> MarkCheck | None:
    """The reject side's interval at one mark (None: a run has no value there yet)."""
    window = window_for(primary, params)
    base = {s: matched_value(points, mark, window) for s, points in baseline.items()}
    test = {s: matched_value(points, mark, window) for s, points in partial_test.items()}
    if any(value is None for value in [*base.values(), *test.values()]):
        return None
    result = contrast(primary, base, test, params)
    look = design.look_at(len(test)) if design is not None else 0
    z_reject = confirm_threshold(result.df, 1, params, design, look).z_reject
    margin = params.early.floor + params.early.slack * (1.0 - min(1.0, mark / budget))
    return MarkCheck(mark, result, z_reject, margin)


def early_stop(
    check: MarkCheck, primary: MetricSpec, budget: int, params: VerdictParams, unit: str = "tokens"
):
    result = check.result
    change = result.effect_abs / result.scale
    return EarlyStop(
        tokens=check.mark,
        reason=(
            f"{primary.metric} at {check.mark:,} {unit} ({check.mark / budget:.0%} of the "
            f"budget): {_num(result.mean_t)} vs baseline {_num(result.mean_b)} "
            f"({_pct(change, signed=True)}), worse by {_zs(-result.z)}σ of noise "
            f"(> {check.z_reject:.2g}σ + {_pct(check.margin)}) at {params.early.consecutive} "
            "consecutive marks"
        ),
        z=-result.z,
        budget_tokens=budget,
    )


def early_reject(
    baseline: Runs,
    partial_test: Runs,
    primary: MetricSpec,
    budget_tokens: int,
    *,
    diverged: bool = False,
    min_frac: float | None = None,
    design: Design | None = None,
    params: VerdictParams | None = None,
    unit: str = "tokens",
) -> EarlyStop | None:
    """Stop a running test that is clearly worse than the baseline (rule: module docstring).

    Scans the token marks the test logged (its grid; the baseline is read at its largest step
    <= each mark) up to the latest one every run reached, and returns the FIRST mark at which
    the rule held at `early.consecutive` consecutive marks: called on every new mark, that is
    the mark just reached. None: keep running. `min_frac` overrides early.min_frac (pass ~1 for
    hypotheses whose gain only shows at the end, e.g. schedule changes). `design`: the test's
    sequential design, whose reject boundary at the current round is the one applied (None:
    the fixed-k rule's). `unit`: what the marks count, as the reason names them (an app's metric
    may be logged by steps)."""
    params = params or load_params()
    if budget_tokens <= 0:
        raise ValueError(f"early_reject: budget_tokens must be > 0, got {budget_tokens}")
    if not baseline or not partial_test:
        return None
    bad = sorted(s for s, points in partial_test.items() if has_nonfinite(points))
    if diverged or bad:
        return diverged_stop(partial_test, primary, bad, budget_tokens)
    start = (params.early.min_frac if min_frac is None else min_frac) * budget_tokens
    streak = 0
    for mark in marks_to_judge(baseline, partial_test, start):
        check = worse_at_mark(baseline, partial_test, primary, mark, budget_tokens, params, design)
        streak = streak + 1 if check is not None and check.hit else 0
        if streak >= params.early.consecutive:
            return early_stop(check, primary, budget_tokens, params, unit)
    return None
