"""A verdict's effect as every output shows it: one sign convention, named by its metric.

The effect of a test is the RELATIVE CHANGE of its primary metric, as measured: the test's seed
mean minus the baseline's, at matched tokens, over |baseline mean|. `eval/loss −3.2% ± 0.2%`
means the held-out loss went down by 3.2% of the baseline's value, with one sigma of seed noise
of 0.2%; `perf/tokens_per_s +8.5%` means throughput went up. Whether a change is better is the
metric's direction (loss: lower, throughput: higher), which the verdict has already applied;
the sign is never flipped to mean "better". The CLI, the MLflow run names and metrics, the
report and the escalation all print it through `describe`.

A verdict is named by the number that decided it: a test rejected because a guard regressed
(`ds.micro_batch=32` faster but worse on eval/loss) is shown as `guard eval/loss +4.2% ± 0.37%`,
not by its primary metric, which did not decide it. A verdict's `z` (and a guard's) keeps the
rule's sign, positive = better, an early rejection's too.

(diag/verdict.py's internal `effect` is the direction-aware improvement, positive = better, which
its rule compares with min_effect; `change` converts.)
"""

from __future__ import annotations

import math
import re
from typing import Any

MINUS = "\u2212"  # a real minus sign: a hyphen next to a number reads as a dash


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def change(verdict: dict[str, Any]) -> float | None:
    """Relative change of the primary metric, test vs baseline, sign as measured; None when
    the verdict compared no values (an early stop without values, a divergence, an error)."""
    base, test = verdict.get("baseline_value"), verdict.get("test_value")
    if not (_finite(base) and _finite(test)):
        return None
    return (test - base) / (abs(base) or 1.0)  # the scale hyprun.diag.verdict's relative noise uses


def metric_key(metric: str) -> str:
    """`eval/loss` -> `eval_loss`: a metric name as one segment of another metric's name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", metric).strip("_") or "metric"


def percent(value: float, signed: bool = True) -> str:
    """`−3.2%`, `+0.41%`, `12%`: two significant digits, a real minus sign."""
    number = 100.0 * value
    text = f"{abs(number):.0f}" if abs(number) >= 10 else f"{abs(number):.2g}"
    if "e" in text:
        text = f"{abs(number):.1e}"
    sign = (MINUS if number < 0 else "+" if number > 0 else "") if signed else ""
    return f"{sign}{text}%"


def deciding_guard(verdict: dict[str, Any]) -> dict[str, Any] | None:
    """The guard whose regression rejected the test (the decision's first rule), as a verdict
    of its own (metric, both means, noise, z, effect); None when the primary decided."""
    if verdict.get("status") != "rejected":
        return None
    guard = next((g for g in verdict.get("guards") or [] if g.get("regressed")), None)
    if guard is None:
        return None
    keys = {"baseline": "baseline_value", "test": "test_value"}
    return {keys.get(key, key): value for key, value in guard.items()}


def describe(verdict: dict[str, Any]) -> str:
    """`eval/loss −3.2% ± 0.2%` — or `guard eval/loss +4.2% ± 0.37%` when a guard's regression
    rejected it, or, without compared values, what happened instead."""
    guard = deciding_guard(verdict)
    if guard is not None:
        return f"guard {describe(guard)}"
    metric = verdict.get("metric") or "eval/loss"
    moved = change(verdict)
    if moved is not None:
        noise = verdict.get("noise")
        spread = f" ± {percent(noise, signed=False)}" if _finite(noise) else ""
        return f"{metric} {percent(moved)}{spread}"
    if verdict.get("early"):
        unit = verdict.get("unit") or "tokens"
        return f"stopped early at {int(verdict.get('tokens') or 0):,} {unit}"
    if "diverged" in str(verdict.get("reason", "")):
        return f"{metric} diverged"
    if verdict.get("pruned") and verdict.get("trials"):  # a sweep none of whose trials ran out
        return f"{metric}: all {verdict['pruned']} trials pruned"
    return f"{metric}: no comparison"
