"""Early rejection: a test's seeds are watched as they train and the test is stopped once it is
clearly worse than the baseline band, saving the rest of its budget.

A test's rounds (runner/control/rounds.py) open one `EarlyRejection` per test, start it at
each round with the baseline seeds of that look, and hands each seed's launcher the callback
`for_seed` returns: our job calls it at every held-out evaluation, an app's watcher
(runner/launch/watch.py) as the declared metric appears in MLflow. The decision itself is pure:
hyprun.diag.verdict.early_reject, the reject side of the round's sequential look.
"""

from __future__ import annotations

import importlib
from typing import Any

from hyprun.diag.metric import MetricSpec
from hyprun.diag.sequential import Design
from hyprun.diag.verdict import compare, early_reject
from hyprun.runner.job.result import JobResult
from hyprun.runner.store.investigation import State, Store


class EarlyRejection:
    """Watches a test's held-out metric as its seeds train; stops the test once it is clearly
    worse than the baseline band (hyprun.diag.verdict.early_reject: the reject side of the round's
    look), saving the rest of its tokens (or steps). `watched`: the metric the seeds report as
    they train, our job's `eval/loss` or an app's declared metric (runner/launch/watch.py reads
    it); a test judged on another metric is not stopped early."""

    def __init__(self, store: Store, primary: MetricSpec, watched: str = "eval/loss"):
        self.store = store
        self.primary = primary
        self.enabled = primary.metric == watched
        self.baseline: dict[int, list[tuple[int, float]]] = {}
        self.partial: dict[int, list[tuple[int, float]]] = {}
        self.design: Design | None = None
        self.stop = None
        self.budget = 0
        self.unit = "tokens"

    def start_round(self, state: State, design: Design, baseline_seeds: list[int]) -> None:
        """The baseline seeds recorded when the round starts are the band it is held to."""
        self.design = design
        self.unit = state.unit
        if self.enabled:
            runs = [state.baseline_run(s) for s in baseline_seeds]
            self.baseline = seed_curves(self.store, runs, self.primary.metric)
            # scipy.stats now (2 s here), not at the first judgement, while an app trains on
            importlib.import_module("scipy.stats")

    def for_seed(self, seed: int, budget: int):
        if not self.enabled:
            return None
        self.budget = budget

        def on_eval(tokens: int, value: float) -> bool:
            if tokens >= budget:  # the end is the full look's, as our job never calls it there
                return False
            self.partial.setdefault(seed, []).append((tokens, value))
            self.stop = early_reject(
                self.baseline,
                self.partial,
                self.primary,
                budget,
                design=self.design,
                unit=self.unit,
            )
            return self.stop is not None

        return on_eval

    def verdict(self, results: list[JobResult], seeds: int) -> dict[str, Any]:
        spent = sum(r.trained(self.unit) for r in results)
        saved = 1.0 - spent / (self.budget * seeds)
        reason = f"rejected early: {self.stop.reason}"
        return {
            **self.numbers(),
            "status": "rejected",
            "early": True,
            "metric": self.primary.metric,
            "reason": reason,
            # a verdict's z is effect / noise, positive = better; the stop counts sigmas worse
            "z": -self.stop.z,
            "tokens": self.stop.tokens,
            "tokens_spent": spent,
            "tokens_saved": saved,
            "seeds_run": len(results),  # the seeds that trained before the stop, not the plan
        }

    def numbers(self) -> dict[str, Any]:
        """The comparison where the test was stopped (effect, noise, both sides' means and
        spreads), as a full test reports them at its end; None where it has none."""
        cut = self.stop.tokens
        base = {s: [p for p in pts if p[0] <= cut] for s, pts in self.baseline.items()}
        ours = {s: [p for p in pts if p[0] <= cut] for s, pts in self.partial.items()}
        try:
            found = compare(base, ours, self.primary).to_dict()
        except ValueError:  # nothing comparable at the stop mark
            found = {}
        keys = ("effect", "noise", "test_value", "test_sigma", "baseline_value", "baseline_sigma")
        return {key: found.get(key) for key in keys}


def seed_curves(
    store: Store, run_ids: list[str], metric: str
) -> dict[int, list[tuple[int, float]]]:
    """{seed: history of `metric`} of the given job runs."""
    curves = {}
    for run_id in run_ids:
        seed = int(store.run(run_id).data.tags.get("hyprun.seed", "0"))
        curves[seed] = store.history(run_id, metric)
    return curves
