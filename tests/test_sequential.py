"""The sequential design (diag/sequential.py): boundaries against published values, the
false-confirmation rate held across looks where peeking with the fixed rule loses it, the plan
of rounds under seed and token caps, and early rejection consistent with a round's look."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hyprun.diag.metric import MetricSpec
from hyprun.diag.sequential import boundaries, fixed, plan, spent
from hyprun.diag.verdict import compare, early_reject, load_params
from tests.test_verdict import BUDGET, LOSS, family

ALPHA = load_params().alpha  # P(Z > 2) = 2.28%
ANY = MetricSpec("eval/loss", "min", min_effect=0.0)  # the hardest case: any gain confirms


def test_boundaries_match_published_lan_demets_values():
    # gsDesign (sfLDOF, sfLDPocock), one-sided alpha 2.5%, 4 equally spaced looks
    obf = boundaries((0.25, 0.5, 0.75, 1.0), 0.025, "obrien_fleming")
    assert obf == pytest.approx((4.333, 2.963, 2.359, 2.014), abs=2e-3)
    pocock = boundaries((0.25, 0.5, 0.75, 1.0), 0.025, "pocock")
    assert pocock == pytest.approx((2.368, 2.368, 2.358, 2.350), abs=1e-2)
    # gsDesign's default sfHSD (gamma -4), 3 equally spaced looks
    hsd = boundaries((1 / 3, 2 / 3, 1.0), 0.025, "hwang_shih_decani")
    assert hsd == pytest.approx((3.010, 2.547, 1.999), abs=2e-3)
    assert boundaries((1.0,), ALPHA, "pocock")[0] == pytest.approx(2.0, abs=1e-4)
    assert spent(1.0, ALPHA, "obrien_fleming") == pytest.approx(ALPHA)
    assert spent(0.5, ALPHA, "obrien_fleming") < spent(0.5, ALPHA, "pocock") < ALPHA


def test_the_boundaries_spend_exactly_alpha_on_brownian_paths():
    rng = np.random.default_rng(3)
    fractions = np.array([0.25, 0.5, 0.75, 1.0])
    for spending in ("obrien_fleming", "pocock", "hwang_shih_decani"):
        bounds = np.array(boundaries(tuple(fractions), 0.025, spending))
        steps = rng.standard_normal((200_000, 4)) * np.sqrt(np.diff(fractions, prepend=0.0))
        z = np.cumsum(steps, axis=1) / np.sqrt(fractions)
        assert (z >= bounds).any(axis=1).mean() == pytest.approx(0.025, abs=0.0015), spending


def test_plan_rounds_and_caps():
    assert plan(2, 8, ALPHA).seeds == (2, 4, 6, 8)
    assert plan(3, 8, ALPHA).seeds == (3, 6, 8)
    assert plan(3, 8, ALPHA, round_seeds=1).seeds == (3, 4, 5, 6, 7, 8)
    assert plan(3, 3, ALPHA).seeds == (3,)  # the cap at the baseline's count: the fixed rule
    # a token cap of 1,000 tokens per seed x 10: 3 test seeds, then 6 (+3 baseline) = 9 <= 10
    assert plan(3, 8, ALPHA, tokens_per_seed=1000, max_tokens=10_000).seeds == (3, 6)
    assert plan(2, 8, ALPHA).fractions == pytest.approx((0.25, 0.5, 0.75, 1.0))
    with pytest.raises(ValueError, match="at least 1 seed"):
        plan(0, 8, ALPHA)


def aa_rate(design, peek_fixed: bool, tests: int = 1500, sigma: float = 0.01) -> float:
    """How often an A/A test is EVER confirmed over the design's looks: with the design's
    boundaries, or (peek_fixed) with the fixed rule applied at every look."""
    rng = np.random.default_rng(2024)
    confirmed = 0
    for _ in range(tests):
        base = 3.0 * (1 + sigma * rng.standard_normal(design.max_seeds))
        test = 3.0 * (1 + sigma * rng.standard_normal(design.max_seeds))
        for seeds in design.seeds:
            b = {s: [(4096, float(v))] for s, v in enumerate(base[:seeds])}
            t = {s: [(4096, float(v))] for s, v in enumerate(test[:seeds])}
            verdict = compare(b, t, ANY, design=None if peek_fixed else design)
            if verdict.status != "inconclusive":
                confirmed += verdict.status == "confirmed"
                break
    return confirmed / tests


def test_the_false_confirmation_rate_holds_across_looks():
    design = plan(2, 8, ALPHA)
    sequential = aa_rate(design, peek_fixed=False)
    peeking = aa_rate(design, peek_fixed=True)
    # alpha is 2.3%; 1,500 tests put a 95% band of about +-0.8% around it
    assert sequential <= ALPHA + 0.01, sequential
    assert peeking > sequential and peeking > ALPHA, (peeking, sequential)


def test_a_real_fix_is_confirmed_in_rounds_and_a_harmful_change_rejected_early():
    rng = np.random.default_rng(5)
    design = plan(2, 8, ALPHA)
    fix_seeds, worse_seeds = [], []
    for effect, found in ((0.03, fix_seeds), (-0.03, worse_seeds)):
        for _ in range(60):
            base = 3.0 * (1 + 0.01 * rng.standard_normal(8))
            test = 3.0 * (1 - effect) * (1 + 0.01 * rng.standard_normal(8))
            for seeds in design.seeds:
                b = {s: [(4096, float(v))] for s, v in enumerate(base[:seeds])}
                t = {s: [(4096, float(v))] for s, v in enumerate(test[:seeds])}
                verdict = compare(b, t, LOSS, design=design)
                if verdict.status != "inconclusive" or verdict.final:
                    break
            found.append((verdict.status, seeds, verdict.round))
    assert sum(s == "confirmed" for s, _, _ in fix_seeds) >= 57  # 95%
    assert sum(s == "rejected" for s, _, _ in worse_seeds) >= 57
    # the harmful one mostly stops before the cap: the reject side spends early (Pocock)
    assert np.mean([n for _, n, _ in worse_seeds]) < np.mean([n for _, n, _ in fix_seeds])


def test_fixed_design_is_the_old_rule():
    base = {s: [(4096, v)] for s, v in enumerate((3.00, 3.03, 2.97))}
    test = {s: [(4096, v)] for s, v in enumerate((2.97, 3.00, 2.94))}
    one = compare(base, test, LOSS, design=fixed(3, ALPHA))
    plain = compare(base, test, LOSS)
    assert one.to_dict() == plain.to_dict() and one.final and one.rounds == 1


def test_early_rejection_is_the_reject_side_of_the_round():
    """Whenever early rejection fires at the end of the budget, the round's own look rejects
    the same curves: one procedure, the early side only ever stricter."""
    rng = np.random.default_rng(13)
    design = plan(3, 8, ALPHA)
    fired = 0
    for gap in np.linspace(0.0, 0.08, 25):
        base, test = family(rng, lambda f, g=gap: g + 0 * f, 0.01, noisier=0.0)
        stop = early_reject(base, test, LOSS, BUDGET, min_frac=0.9, design=design)
        verdict = compare(base, test, LOSS, design=design)
        if stop is not None:
            fired += 1
            assert verdict.status == "rejected", (gap, stop, verdict.reason)
        if verdict.status == "confirmed":
            assert stop is None
    assert fired >= 5  # not vacuous
    assert math.isfinite(design.reject_z(0))


def shipped(start: int, alpha: float = ALPHA):
    """The design a test of a `start`-seed baseline runs with the table's numbers."""
    rule = load_params().sequential
    return plan(
        start,
        rule.max_seeds,
        alpha,
        confirm_spending=rule.confirm_spending,
        reject_spending=rule.reject_spending,
    )


def test_a_huge_effect_is_confirmed_at_the_first_look():
    """A 2-seed baseline, a fix worth -48% at 0.96% noise (z = 50): decided in round 1. The
    test's own two seeds agree closely, the baseline's do not; the noise's degrees of freedom
    count both sides' seeds (2), not the 1 that Welch's df falls to on such spreads."""
    base = {0: [(4096, 3.0)], 1: [(4096, 3.0582)]}
    test = {0: [(4096, 1.5752)], 1: [(4096, 1.5754)]}
    verdict = compare(base, test, LOSS, design=shipped(2))
    assert verdict.status == "confirmed" and verdict.round == 1, verdict.reason
    assert verdict.effect == pytest.approx(0.48, abs=0.005) and verdict.z == pytest.approx(50, 0.01)
    assert verdict.df == 2


def test_the_best_of_a_sweep_goes_on_in_rounds_at_alpha_over_trials():
    """A sweep's best of 4 trials on a 2-seed baseline, -40% at 1.3% noise (z = 30.6): judged
    once at the baseline's seeds it may end inconclusive with no round to follow; in rounds at
    alpha / 4 a second look follows, and decides."""
    base = {0: [(4096, 3.0)], 1: [(4096, 3.079)], 2: [(4096, 3.01)], 3: [(4096, 3.06)]}
    test = {0: [(4096, 1.8237)], 1: [(4096, 1.8239)], 2: [(4096, 1.83)], 3: [(4096, 1.82)]}
    first = {s: base[s] for s in (0, 1)}, {s: test[s] for s in (0, 1)}
    design = shipped(2, ALPHA / 4)
    assert compare(*first, LOSS, looks=4).z == pytest.approx(30.6, abs=0.5)
    look = compare(*first, LOSS, design=design, looks=4)
    assert look.status == "confirmed" or not look.final, look.reason
    second = compare(base, test, LOSS, design=design, looks=4)
    assert second.status == "confirmed" and second.round == 2, second.reason
    assert "best of 4 trials, alpha / 4" in second.reason
