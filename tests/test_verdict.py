"""Tests for the hypothesis verdict (diag/verdict.py): hand-computed cases, matched tokens, seed
noise, paired statistics, A/A false-confirmation rates and early-rejection properties."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from statistics import NormalDist

import numpy as np
import pytest

from hyprun.diag.verdict import (
    TABLE,
    EarlyStop,
    MetricSpec,
    compare,
    early_reject,
    load_params,
    matched_value,
    z_threshold,
)

LOSS = MetricSpec("eval/loss", "min", min_effect=0.01)
TPS = MetricSpec("perf/tokens_per_s", "max")
PARAMS = load_params()
BASE3 = {0: 3.00, 1: 3.03, 2: 2.97}  # mean 3.0, sample sd 0.03 (1%)


def runs(values: dict[int, float], tokens: int = 4096) -> dict[int, list[tuple[int, float]]]:
    """seed -> a two-point history ending at `tokens` with the given value (early point 5.0)."""
    return {s: [(1024, 5.0), (tokens, float(v))] for s, v in values.items()}


# --- the small-sample threshold (scipy.stats' Student t) -------------------------------------


def test_small_sample_thresholds_match_the_tables():
    # z whose one-sided tail is 2.5% -> the t quantiles of 97.5% in any table
    z975 = NormalDist().inv_cdf(0.975)
    assert z_threshold(z975, 1) == pytest.approx(12.7062, abs=1e-3)
    assert z_threshold(z975, 2) == pytest.approx(4.3027, abs=1e-4)
    assert z_threshold(z975, 4) == pytest.approx(2.7764, abs=1e-4)
    assert z_threshold(z975, 10) == pytest.approx(2.2281, abs=1e-4)
    assert z_threshold(NormalDist().inv_cdf(0.995), 30) == pytest.approx(2.7500, abs=1e-4)
    # the small-sample threshold: same one-sided confidence as z=2 (97.7%)
    assert z_threshold(2.0, 4) == pytest.approx(2.869, abs=1e-3)
    assert z_threshold(2.0, math.inf) == 2.0
    assert z_threshold(2.0, 4, small_sample=False) == 2.0


# --- matched values ---------------------------------------------------------------------------


def test_matched_value_takes_the_largest_step_at_or_before_tokens():
    pts = [(3000, 2.5), (1000, 4.0), (2000, 3.0)]  # unsorted on purpose
    assert matched_value(pts, 2500) == 3.0
    assert matched_value(pts, 2000) == 3.0
    assert matched_value(pts, 10_000) == 2.5
    assert matched_value(pts, 999) is None


def test_matched_value_window_is_a_median_robust_to_one_odd_step():
    pts = [(s, 100.0 + (s % 3)) for s in range(1, 101)]
    pts[-1] = (100, 1e6)  # one odd last step (a timer hiccup)
    assert matched_value(pts, 100) == 1e6
    # last 25% of tokens up to 100: steps 75..100, values 100..102, median 101
    assert matched_value(pts, 100, window=0.25) == 101.0
    # a window holding no point falls back to the value logged at the largest step <= tokens
    assert matched_value([(10, 1.0), (50, 2.0)], 100, window=0.25) == 2.0


# --- the verdict arithmetic on hand-computed cases ---------------------------------------------


def test_confirmed_by_hand():
    # baseline 3.00/3.03/2.97: mean 3.0, sd 0.03; test 2.86/2.88/2.81: mean 2.85, var 0.0013
    v = compare(runs(BASE3), runs({0: 2.86, 1: 2.88, 2: 2.81}), LOSS)
    noise_abs = math.sqrt(0.0009 / 3 + 0.0013 / 3)
    assert v.status == "confirmed", v.reason
    assert v.effect == pytest.approx(0.05)  # (3.0 - 2.85) / 3.0, positive = better for "min"
    assert v.effect_abs == pytest.approx(-0.15)
    assert v.noise == pytest.approx(noise_abs / 3.0)
    assert v.z == pytest.approx(0.05 / (noise_abs / 3.0))  # 5.54
    # the noise's df counts both sides' seeds: 3 + 3 - 2 (not Welch's 3.87 from the two spreads)
    assert v.df == 4
    assert v.z_needed == pytest.approx(z_threshold(2.0, v.df))
    assert (v.tokens, v.n_baseline, v.n_test) == (4096, 3, 3)
    assert v.decide is None
    assert v.reason.startswith("eval/loss 3 -> 2.85 (-5% ± 0.9%, z=5.5) beyond min effect 1%")


def test_paired_statistics_by_hand():
    v = compare(runs(BASE3), runs({0: 2.86, 1: 2.88, 2: 2.81}), LOSS)
    p = v.paired
    # d = -0.14, -0.15, -0.16: mean -0.15, sd 0.01, t = 0.15 / (0.01 / sqrt 3) (positive = better)
    assert p["n"] == 3 and p["seeds"] == [0, 1, 2] and p["df"] == 2
    assert p["mean"] == pytest.approx(-0.15)
    assert p["sd"] == pytest.approx(0.01)
    t = 0.15 / (0.01 / math.sqrt(3))
    assert p["t"] == pytest.approx(t)
    assert p["p"] == pytest.approx(1 - t / math.sqrt(t * t + 2))  # two-sided, df 2 closed form
    assert p["effect"] == pytest.approx(0.05)
    assert p["available"] and p["agrees"]
    # fewer than 2 common seeds: no paired comparison
    assert compare(runs(BASE3), runs({7: 2.9}), LOSS).paired is None


def test_paired_disagreement_blocks_a_confirmation():
    # Seeds 0-2 are low on both sides; the baseline's extra seeds 3-11 are high. Unpaired, the
    # test looks 2% better beyond noise; paired on the common seeds, it is worse on every seed.
    base = {0: 3.00, 1: 3.01, 2: 2.99, **{s: 3.10 + 0.002 * (s % 3) for s in range(3, 12)}}
    test = {0: 3.012, 1: 3.019, 2: 3.001}
    v = compare(runs(base), runs(test), LOSS)
    assert v.effect > LOSS.min_effect and v.z > v.z_needed  # unpaired alone would confirm
    assert v.paired["n"] == 3 and not v.paired["agrees"] and v.paired["t"] < 0
    assert v.status == "inconclusive"
    assert "paired comparison over 3 common seeds disagrees" in v.reason
    assert v.decide and v.decide.startswith("rerun with the same seeds on both sides")


def test_rejected_by_no_effect():
    # 0.17% better, noise 0.82%: even the upper bound 0.17% + 2.87 x 0.82% = 2.5% is below 5%
    spec = MetricSpec("eval/loss", "min", min_effect=0.05)
    v = compare(runs(BASE3), runs({0: 2.995, 1: 3.025, 2: 2.965}), spec)
    assert v.status == "rejected", v.reason
    assert v.effect == pytest.approx(0.005 / 3)
    assert v.effect + v.z_needed * v.noise == pytest.approx(
        0.005 / 3 + 2.8693 * 0.0081650, rel=1e-3
    )
    assert "improvement at most 2.5%" in v.reason and "below min effect 5%" in v.reason
    # the same numbers with a 1% min effect: the upper bound reaches it, so not rejected
    assert compare(runs(BASE3), runs({0: 2.995, 1: 3.025, 2: 2.965}), LOSS).status == "inconclusive"


def test_rejected_by_worse():
    v = compare(runs(BASE3), runs({0: 3.15, 1: 3.18, 2: 3.12}), LOSS)
    assert v.status == "rejected"
    assert v.effect == pytest.approx(-0.05)
    assert v.z == pytest.approx(-0.05 / (math.sqrt(0.0006) / 3))  # -6.12
    assert "worse than baseline beyond" in v.reason and "+5%" in v.reason


def test_rejected_by_guard_regression():
    base_tps = {
        s: [(i * 512, 10_000.0 + 50.0 * ((i + s) % 3)) for i in range(1, 9)] for s in range(3)
    }
    slow_tps = {
        s: [(i * 512, 8_000.0 + 50.0 * ((i + s) % 3)) for i in range(1, 9)] for s in range(3)
    }
    tiny_tps = {
        s: [(i * 512, 9_950.0 + 50.0 * ((i + s) % 3)) for i in range(1, 9)] for s in range(3)
    }
    base, test = runs(BASE3), runs({0: 2.86, 1: 2.88, 2: 2.81})  # confirmed on its own
    v = compare(base, test, LOSS, [TPS], {TPS.metric: base_tps}, {TPS.metric: slow_tps})
    assert v.status == "rejected"
    (g,) = v.guards
    assert g["metric"] == "perf/tokens_per_s" and g["regressed"]
    assert g["effect"] == pytest.approx(-0.2, abs=0.01)
    assert v.reason.startswith("guard perf/tokens_per_s 10,050 -> 8,050 (-20%")
    assert "primary eval/loss" in v.reason
    # 0.5% slower: beyond its (tiny) noise but within the 1% guard floor -> not a regression
    v = compare(base, test, LOSS, [TPS], {TPS.metric: base_tps}, {TPS.metric: tiny_tps})
    assert v.guards[0]["z"] < -v.guards[0]["z_needed"] and not v.guards[0]["regressed"]
    assert v.status == "confirmed"
    # a guard's own min_effect replaces the floor
    strict = dataclasses.replace(TPS, min_effect=0.001)
    v = compare(base, test, LOSS, [strict], {TPS.metric: base_tps}, {TPS.metric: tiny_tps})
    assert v.guards[0]["regressed"] and v.status == "rejected"
    with pytest.raises(ValueError, match="guard perf/tokens_per_s"):
        compare(base, test, LOSS, [TPS])


def test_rejected_by_divergence():
    test = runs({0: 2.86, 1: 2.88, 2: 2.81})
    test[1] = [(1024, 4.0), (2048, math.nan)]
    v = compare(runs(BASE3), test, LOSS)
    assert v.status == "rejected" and v.reason.startswith("diverged: test seed(s) 1")
    assert v.tokens == 4096
    d = v.to_dict()
    assert d["effect"] is None and d["status"] == "rejected"
    json.dumps(d, allow_nan=False)  # JSON-safe
    # marked by the caller (e.g. from the hyprun.outcome tag) with finite numbers
    v = compare(runs(BASE3), runs({0: 2.86, 1: 2.88, 2: 2.81}), LOSS, diverged=True)
    assert v.status == "rejected" and "marked diverged by the caller" in v.reason


def test_against_a_diverged_baseline_the_question_is_whether_the_divergence_goes_away():
    blown = {0: [(1024, 5.0), (2048, math.nan)], 1: [(1024, 5.1), (2048, math.inf)]}
    v = compare(blown, runs({0: 2.9, 1: 2.95}), LOSS)
    assert v.status == "confirmed" and v.reason.startswith("removes the divergence")
    assert "by 2,048 tokens" in v.reason and v.tokens == 4096
    # an app whose metric counts optimizer steps is told in steps, not tokens
    in_steps = compare(blown, runs({0: 2.9, 1: 2.95}), LOSS, unit="steps").reason
    assert "by 2,048 steps" in in_steps and "trained to 4,096 steps" in in_steps
    assert (
        compare(blown, {0: [(1024, 4.0), (2048, math.nan)], 1: [(4096, 3.0)]}, LOSS).status
        == "rejected"
    )
    # a test that stops before the point where the baseline blew up shows nothing
    assert compare(blown, runs({0: 2.9, 1: 2.95}, tokens=2048), LOSS).status == "inconclusive"
    # one baseline seed of two diverging, none of the test's: could be chance
    partial = {0: blown[0], 1: [(1024, 5.0), (4096, 3.0)]}
    v = compare(partial, runs({0: 2.9, 1: 2.95}), LOSS)
    assert v.status == "inconclusive" and "more seeds" in v.decide
    # diverged before its first point: the caller says so; unsaid, there is nothing to compare
    v = compare({0: [], 1: []}, runs({0: 2.9, 1: 2.95}), LOSS, baseline_diverged=[0, 1])
    assert v.status == "confirmed"
    with pytest.raises(ValueError, match="baseline seed 0: no eval/loss points"):
        compare({0: [], 1: []}, runs({0: 2.9, 1: 2.95}), LOSS)
    json.dumps(v.to_dict(), allow_nan=False)


def test_inconclusive_says_how_many_seeds_would_decide():
    # 1% better with 1% seed noise per seed and 3 seeds: z = 1.22, below 2.87
    v = compare(runs(BASE3), runs({0: 2.97, 1: 3.00, 2: 2.94}), LOSS)
    assert v.status == "inconclusive"
    assert v.z == pytest.approx(0.01 / (math.sqrt(0.0006) / 3))
    assert "within 2.9σ noise" in v.reason
    # n = 2 (z sigma / delta)^2 = 2 (2 x 1% / 1%)^2 = 8, raised to 10 by the t threshold:
    # at 9 per side 2.24 x 1% x sqrt(2/9) = 1.06% > 1%; at 10, 2.21 x sqrt(2/10) % = 0.99%
    assert v.decide.startswith(
        "about 10 seeds per side (now 3/3) would separate a 1% min effect from seed noise "
        "(σ=1% per seed"
    )
    plain = dataclasses.replace(PARAMS, small_sample=False)
    v = compare(runs(BASE3), runs({0: 2.97, 1: 3.00, 2: 2.94}), LOSS, params=plain)
    assert v.status == "inconclusive" and v.decide.startswith("about 8 seeds per side")
    # no effect and no min effect: nothing to separate (the same values on other seeds)
    v = compare(runs(BASE3), runs({0: 3.03, 1: 2.97, 2: 3.00}), MetricSpec("eval/loss", "min"))
    assert v.status == "inconclusive" and "set a min_effect" in v.decide


def test_curves_identical_to_the_baseline_are_no_effect_not_noise():
    # A change that does nothing to the computation: every seed's curve, bit for bit.
    v = compare(runs(BASE3), runs(BASE3), MetricSpec("eval/loss", "min"))
    assert v.status == "rejected" and v.identical and v.effect == 0.0
    assert v.reason.startswith("no effect (identical to baseline)")
    # the same values with one bit off are a measurement again, not a no-op
    nudged = runs({0: 3.00, 1: 3.03, 2: math.nextafter(2.97, 3.0)})
    v = compare(runs(BASE3), nudged, MetricSpec("eval/loss", "min"))
    assert not v.identical and v.status == "inconclusive"


def test_single_baseline_seed_uses_the_floor_and_says_so():
    v = compare(runs({0: 3.0}), runs({0: 2.9}), LOSS)
    # sigma_b = 0.5% x 3.0 = 0.015; the test borrows it: noise = sqrt(2) x 0.015 / 3.0
    assert v.noise == pytest.approx(math.sqrt(2) * 0.005)
    assert v.z == pytest.approx((0.1 / 3.0) / (math.sqrt(2) * 0.005))  # 4.71
    assert math.isinf(v.df) and v.z_needed == 2.0  # an assumed sigma has no df to correct
    assert v.status == "confirmed"
    assert "1 baseline seed: seed noise assumed 0.5% per seed" in v.reason
    # 0.33% better +- 0.71%: could still be 1% (upper bound 1.75%) -> inconclusive; the assumed
    # sigma 0.5% gives n = 2 (2 x 0.5% / 1%)^2 = 2, raised to 4 by the t threshold at 2n-2 df
    v = compare(runs({0: 3.0}), runs({0: 2.99}), LOSS)
    assert v.status == "inconclusive" and "1 baseline seed" in v.reason
    assert v.decide.startswith("about 4 seeds per side (now 1/1)")


def test_matched_tokens_across_step_grids():
    # Batch-size hypothesis: the baseline logs every 1024 tokens, the test every 4096 and has
    # reached 98,304 tokens so far; both are read at 98,304, not at the same step index.
    def curve(t: float) -> float:
        return 2.0 + 3.0 * math.exp(-t / 30_000)

    base = {
        s: [(t, curve(t) * (1 + 0.002 * s)) for t in range(1024, 102_401, 1024)] for s in range(3)
    }
    test = {
        s: [(t, 0.95 * curve(t) * (1 + 0.002 * s)) for t in range(4096, 98_305, 4096)]
        for s in range(3)
    }
    v = compare(base, test, LOSS)
    assert v.tokens == 98_304
    assert v.baseline_value == pytest.approx(curve(98_304) * 1.002)
    assert v.effect == pytest.approx(0.05)
    assert v.status == "confirmed"
    # By step index (the 6th logged value of each) the test would look 29% better, not 5%.
    assert test[0][5][1] / base[0][5][1] < 0.75
    # A grid that does not divide the other: the baseline is read at its largest step <= mark.
    odd = {s: [(t, curve(t)) for t in range(3000, 99_001, 3000)] for s in range(3)}
    v = compare(base, odd, LOSS)
    assert v.tokens == 99_000
    assert v.baseline_value == pytest.approx(np.mean([p[1] for p in base_at(base, 98_304)]))


def base_at(base: dict, tokens: int) -> list:
    return [next(p for p in pts if p[0] == tokens) for pts in base.values()]


def test_direction_max_tokens_per_second():
    rng = np.random.default_rng(0)

    def tps(level: float, seed: int) -> list[tuple[int, float]]:
        vals = level * (1 + 0.01 * seed) * (1 + 0.02 * rng.standard_normal(100))
        pts = [(i * 1000, float(v)) for i, v in enumerate(vals, start=1)]
        pts[-1] = (100_000, level * 5)  # one odd step at the end: the window median ignores it
        return pts

    base = {s: tps(10_000.0, s) for s in range(3)}
    faster = {s: tps(12_000.0, s) for s in range(3)}
    v = compare(base, faster, TPS)  # perf/* -> median over the last 25% (table `windows`)
    assert v.status == "confirmed"
    assert v.effect == pytest.approx(0.2, abs=0.01)  # higher is better: +20%
    assert v.effect_abs > 0 and v.z > 0
    v = compare(faster, base, TPS)
    assert v.status == "rejected" and v.effect == pytest.approx(-1 / 6, abs=0.01)
    # with no window, the odd last step decides
    raw = dataclasses.replace(TPS, window=0.0)
    assert compare(base, faster, raw).baseline_value == pytest.approx(50_000.0)


# --- A/A: the same config on different seeds must practically never be confirmed ---------------


def aa_rates(spec: MetricSpec, params=PARAMS, pairs: int = 2000, k: int = 3, sigma: float = 0.01):
    rng = np.random.default_rng(12345)
    counts = {"confirmed": 0, "rejected": 0, "inconclusive": 0}
    for _ in range(pairs):
        b = 3.0 * (1 + sigma * rng.standard_normal(k))
        t = 3.0 * (1 + sigma * rng.standard_normal(k))
        counts[
            compare(runs(dict(enumerate(b))), runs(dict(enumerate(t))), spec, params=params).status
        ] += 1
    return {key: n / pairs for key, n in counts.items()}


def test_aa_false_confirmation_rate():
    any_effect = aa_rates(MetricSpec("eval/loss", "min", min_effect=0.0))
    with_min = aa_rates(LOSS)
    assert any_effect["confirmed"] <= 0.05
    # the t test at 2n - 2 df is exact here (one spread, unpaired seeds): alpha itself, 2.3%,
    # with min effect 0; below it with a min effect to clear
    assert with_min["confirmed"] < PARAMS.alpha
    # the few-seed t correction is what keeps the rate down: plain z=2 confirms more often
    plain = aa_rates(
        MetricSpec("eval/loss", "min"), dataclasses.replace(PARAMS, small_sample=False)
    )
    assert plain["confirmed"] > any_effect["confirmed"]


# --- early rejection ---------------------------------------------------------------------------

BUDGET = 409_600
BASE_GRID = np.arange(10_240, BUDGET + 1, 10_240)  # every 2.5% of the budget
TEST_GRID = np.arange(20_480, BUDGET + 1, 20_480)  # every 5%


def base_curve(f: np.ndarray) -> np.ndarray:
    return 2.0 + 3.0 * np.exp(-5.0 * f)


def family(rng, gap, sigma: float, k: int = 3, noisier: float = 2.0, rho: float = 0.5):
    """Baseline and test eval/loss curves of k paired seeds. test = baseline x (1 + gap(f)) at
    budget fraction f; a seed's level offset is shared with correlation rho between the two
    sides (same init and data order); the test's seed spread is (1 + noisier (1 - f)) sigma
    (a higher LR is noisier early); each eval adds sigma/3 of independent noise."""
    u = rng.standard_normal(k)
    w = rho * u + math.sqrt(1 - rho * rho) * rng.standard_normal(k)
    fb, ft = BASE_GRID / BUDGET, TEST_GRID / BUDGET
    base, test = {}, {}
    for s in range(k):
        yb = base_curve(fb) * (1 + sigma * u[s] + sigma / 3 * rng.standard_normal(fb.size))
        st = sigma * (1 + noisier * (1 - ft))
        yt = (
            base_curve(ft)
            * (1 + gap(ft))
            * (1 + st * w[s] + sigma / 3 * rng.standard_normal(ft.size))
        )
        base[s] = [(int(t), float(y)) for t, y in zip(BASE_GRID, yb, strict=True)]
        test[s] = [(int(t), float(y)) for t, y in zip(TEST_GRID, yt, strict=True)]
    return base, test


def test_early_reject_never_stops_a_run_that_ends_confirmed():
    # Late improvements of 2/5/10% (gap -e f^3) on curves that are worse early by up to
    # p (1 - f)^2 (8% at the start, 3.4% at 35%), with seed noise 0.2-1% and noisier tests.
    rng = np.random.default_rng(7)
    confirmed = stopped_confirmed = 0
    for p, e, sigma, _ in itertools.product(
        (0.0, 0.04, 0.08), (0.02, 0.05, 0.10), (0.002, 0.005, 0.01), range(6)
    ):
        base, test = family(rng, lambda f, p=p, e=e: p * (1 - f) ** 2 - e * f**3, sigma)
        if compare(base, test, LOSS).status == "confirmed":
            confirmed += 1
            stop = early_reject(base, test, LOSS, BUDGET)
            stopped_confirmed += stop is not None
    assert confirmed >= 120  # of 162: the property is not vacuous
    assert stopped_confirmed == 0


def test_early_reject_stops_clearly_worse_runs_before_60_percent():
    rng = np.random.default_rng(8)
    saved = []
    for sigma, _ in itertools.product((0.002, 0.005), range(10)):
        base, test = family(rng, lambda f: 0.10 + 0 * f, sigma, noisier=0.0)  # +10% loss
        stop = early_reject(base, test, LOSS, BUDGET)
        assert stop is not None and stop.tokens < 0.6 * BUDGET, stop
        assert compare(base, test, LOSS).status == "rejected"
        saved.append(stop.saved)
    assert min(saved) >= 0.4
    assert np.mean(saved) == pytest.approx(0.65)  # the first two marks after 30%: 30% and 35%


def test_early_reject_incremental_calls_stop_at_the_same_mark():
    base, test = family(np.random.default_rng(9), lambda f: 0.10 + 0 * f, 0.005, noisier=0.0)
    full = early_reject(base, test, LOSS, BUDGET)
    first = None
    for mark in TEST_GRID:
        partial = {s: [p for p in pts if p[0] <= mark] for s, pts in test.items()}
        first = early_reject(base, partial, LOSS, BUDGET)
        if first:
            break
    assert isinstance(first, EarlyStop) and first.tokens == full.tokens == 143_360
    assert first.z > PARAMS.z_confirm and "2 consecutive marks" in first.reason
    assert first.to_dict()["saved"] == pytest.approx(0.65)


def test_early_reject_waits_for_min_frac_and_consecutive_marks():
    base, test = family(np.random.default_rng(10), lambda f: 0.10 + 0 * f, 0.005, noisier=0.0)
    before = {s: [p for p in pts if p[0] < 0.3 * BUDGET] for s, pts in test.items()}
    assert early_reject(base, before, LOSS, BUDGET) is None  # +10% but before 30%
    one = {s: [p for p in pts if p[0] <= 0.3 * BUDGET] for s, pts in test.items()}
    assert early_reject(base, one, LOSS, BUDGET) is None  # one mark at 30% is not two
    assert early_reject(base, test, LOSS, BUDGET, min_frac=0.9).tokens == 389_120  # 95%


def test_early_reject_leaves_aa_and_better_runs_alone():
    rng = np.random.default_rng(11)
    for sigma, _ in itertools.product((0.002, 0.005, 0.01), range(10)):
        base, test = family(rng, lambda f: 0 * f, sigma, noisier=0.0)
        assert early_reject(base, test, LOSS, BUDGET) is None
        base, test = family(rng, lambda f: -0.05 * f, sigma)
        assert early_reject(base, test, LOSS, BUDGET) is None


def test_early_reject_stops_a_diverged_run_at_once():
    base, test = family(np.random.default_rng(12), lambda f: 0 * f, 0.005)
    test[2] = test[2][:3] + [(81_920, math.nan)]
    stop = early_reject(base, test, LOSS, BUDGET)
    assert stop is not None and stop.reason.startswith("diverged: test seed(s) 2")
    assert stop.tokens == 81_920 and math.isinf(stop.z)
    assert early_reject(base, {0: test[0][:2]}, LOSS, BUDGET, diverged=True) is not None


# --- table and inputs --------------------------------------------------------------------------


def test_table_loads_and_rejects_unknown_keys(tmp_path):
    assert TABLE.name == "verdict.yaml"
    assert (
        PARAMS.z_confirm == 2.0
        and PARAMS.early.min_frac == 0.3
        and PARAMS.windows == {"perf/": 0.25}
    )
    bad = tmp_path / "verdict.yaml"
    bad.write_text("verdict:\n  z_confrim: 3\n")
    with pytest.raises(ValueError, match="unknown key verdict.z_confrim"):
        load_params(bad)
    bad.write_text("verdict:\n  early: {zz: 1}\n")
    with pytest.raises(ValueError, match="unknown key verdict.early.zz"):
        load_params(bad)


def test_triage_table_loader_skips_the_verdict_table():
    from hyprun.diag.triage import load_tables

    assert all("verdict.yaml" not in row.source for row in load_tables())


def test_metric_spec_validates():
    with pytest.raises(ValueError, match="direction"):
        MetricSpec("eval/loss", "lower")
    with pytest.raises(ValueError, match="min_effect"):
        MetricSpec("eval/loss", "min", min_effect=-0.1)
    with pytest.raises(ValueError, match="no baseline"):
        compare({}, runs({0: 1.0}), LOSS)
