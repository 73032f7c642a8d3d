"""One sign convention for effects: the change as measured, named by its metric."""

from __future__ import annotations

import pytest

from hyprun.diag.effect import change, describe, metric_key, percent
from hyprun.diag.verdict import MetricSpec, compare


def runs(values: list[float], tokens: int = 4096) -> dict[int, list[tuple[int, float]]]:
    return {seed: [(1024, 9.0), (tokens, v)] for seed, v in enumerate(values)}


def test_a_lower_loss_is_a_negative_change_and_a_confirmed_improvement():
    verdict = compare(
        runs([3.00, 3.01, 2.99]), runs([2.90, 2.91, 2.89]), MetricSpec("eval/loss", "min", 0.01)
    ).to_dict()
    assert verdict["status"] == "confirmed" and verdict["effect"] > 0  # the rule: + = better
    assert change(verdict) == pytest.approx(-0.1 / 3.0)  # shown: as measured
    assert describe(verdict).startswith("eval/loss \u22123.3% ± 0.")


def test_a_higher_throughput_is_a_positive_change():
    throughput = MetricSpec("perf/tokens_per_s", "max")
    verdict = compare(runs([100.0, 101.0, 99.0]), runs([120.0, 121.0, 119.0]), throughput)
    verdict = verdict.to_dict()
    assert change(verdict) == pytest.approx(0.2)
    assert describe(verdict).startswith("perf/tokens_per_s +20% ± ")


def test_no_values_compared_says_what_happened():
    assert change({"metric": "eval/loss", "early": True, "tokens": 2048}) is None
    assert describe({"early": True, "tokens": 2048}) == "stopped early at 2,048 tokens"
    assert describe({"metric": "eval/loss", "reason": "diverged: seed 1"}) == "eval/loss diverged"
    swept = {"metric": "eval/loss", "status": "rejected", "pruned": 4, "trials": [{}] * 4}
    assert describe(swept) == "eval/loss: all 4 trials pruned"


def test_formatting():
    assert [percent(x) for x in (-0.0324, 0.0041, 0.0, 0.2, -1.5)] == [
        "\u22123.2%",
        "+0.41%",
        "0%",
        "+20%",
        "\u2212150%",
    ]
    assert metric_key("eval/loss") == "eval_loss" and metric_key("perf/tokens per s") == (
        "perf_tokens_per_s"
    )


def test_a_guard_rejection_is_named_by_the_guard_that_decided_it():
    """Demo H3: faster (the primary, within its noise) but worse on the eval/loss guard: the
    verdict is the guard's, so its name is the guard's number, not the throughput's."""
    throughput = MetricSpec("perf/tokens_per_s", "max")
    loss = MetricSpec("eval/loss", "min")
    verdict = compare(
        runs([100.0, 130.0, 70.0]),
        runs([140.0, 100.0, 160.0]),
        throughput,
        [loss],
        {"eval/loss": runs([4.80, 4.82, 4.84])},
        {"eval/loss": runs([5.02, 5.04, 5.06])},
    ).to_dict()
    assert verdict["status"] == "rejected" and verdict["guards"][0]["regressed"], verdict
    assert change(verdict) == pytest.approx(1 / 3)  # the primary's change, as its metric logs it
    assert describe(verdict) == "guard eval/loss +4.6% ± 0.34%"
