"""Fixed-k against sequential verdicts, side by side on simulated test families.

    python -m bench.verdicts [--families 700] [--aa 2000] [--json FILE]

Each family is one test against its baseline: k0 seeds per side to start with, per-seed relative
noise sigma (1%), seed s of the test sharing half its noise with seed s of the baseline (same
init and data order), and a true change of the primary metric (eval/loss, min_effect 1%):
A/A (none; also with the test's seed noise doubled, a change that adds noise and nothing else),
worse (-2%), a real fix at 2x and 4x the min effect, a huge one (-48%), and sweeps: the best of 4
trials at k0 seeds (A/A, and -40%), judged at alpha / 4 in every round. Every rule sees the same
draws (seeds beyond k0 are drawn up front and revealed round by round), and is scored on:

- verdict accuracy: an A/A or worse test not confirmed, a real fix confirmed;
- false confirmations on A/A, with the exact (Clopper-Pearson) 95% interval;
- seeds per side and tokens per decided test (tokens: the test's seeds plus the baseline seeds a
  round adds, one budget each: the cost when no other test shares them);
- for the large effects, the share decided at the first look and the mean rounds taken.

The rules: the fixed-k rule at the baseline's k0 seeds (today's `hyprun test --max-seeds k0`),
the fixed-k rule at the cap (every test at 8 seeds), and the sequential design
(diag/sequential.py) with three pairs of spending functions (confirm side/reject side). The pair
is chosen on the tuning draws (random seed 1: the highest accuracy among the pairs that decide
at least 95% of the -48% fixes at the first look) and scored on held-out draws (seed 2): both
are printed; the choice is what diag/tables/verdict.yaml ships (Hwang-Shih-DeCani/Pocock).
Early rejection is not simulated here (its curves are single values at the end of the budget);
tests/test_verdict.py and tests/test_sequential.py cover it on curve families.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from hyprun.diag.metric import MetricSpec
from hyprun.diag.sequential import Design, fixed, plan
from hyprun.diag.verdict import compare, load_params

SPEC = MetricSpec("eval/loss", "min", min_effect=0.01)
ANY = MetricSpec("eval/loss", "min", min_effect=0.0)
"""The hardest A/A case: any gain beyond noise would confirm."""
SIGMA = 0.01
RHO = 0.5
START = 2
CAP = 8
EFFECTS = {
    "A/A": 0.0,
    "A/A, min effect 0": 0.0,
    "A/A, test noise 2x": 0.0,
    "worse 2%": -0.02,
    "fix 2%": 0.02,
    "fix 4%": 0.04,
    "fix 48%": 0.48,
    "sweep A/A, best of 4": 0.0,
    "sweep fix 40%, best of 4": 0.40,
}
"""True relative improvement of each family kind (positive = lower loss)."""
NOISIER = {"A/A, test noise 2x": 2.0}
"""Families whose test seeds are noisier than the baseline's (a change that adds seed noise and
nothing else): the null the verdict must not confirm either."""
TRIALS = 4
"""Trials of a sweep family: the best of them (lowest mean at k0 seeds) is judged, with the
confirmation corrected for TRIALS looks; the others share its baseline and seeds' init/data."""


def draw(
    rng: np.random.Generator, effect: float, seeds: int, noisier: float = 1.0, trials: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Baseline and test values of `seeds` paired seeds (level 3.0); with `trials` > 1 the
    test values of the best of that many trials at START seeds (a sweep)."""
    shared = rng.standard_normal(seeds)
    baseline = 3.0 * (1 + SIGMA * shared)
    tests = []
    for _ in range(trials):
        own = RHO * shared + math.sqrt(1 - RHO * RHO) * rng.standard_normal(seeds)
        tests.append(3.0 * (1 - effect) * (1 + SIGMA * noisier * own))
    return baseline, min(tests, key=lambda test: float(np.mean(test[:START])))


def runs(values: np.ndarray) -> dict[int, list[tuple[int, float]]]:
    return {seed: [(4096, float(v))] for seed, v in enumerate(values)}


@dataclass
class Outcome:
    status: str
    seeds: int
    tokens: int
    rounds: int = 1


def sequence(
    design: Design, baseline: np.ndarray, test: np.ndarray, spec=SPEC, looks: int = 1
) -> Outcome:
    """Run the design's looks on the first n seeds of each side until one decides; `looks` > 1:
    the test is the best of that many trials, judged at alpha / looks in every round."""
    if looks > 1:
        design = replace(design, alpha=design.alpha / looks)
    for look, seeds in enumerate(design.seeds):
        verdict = compare(
            runs(baseline[:seeds]), runs(test[:seeds]), spec, design=design, looks=looks
        )
        if verdict.status != "inconclusive" or verdict.final:
            added = max(0, seeds - START)  # baseline seeds beyond the recorded ones
            return Outcome(verdict.status, seeds, seeds + added, look + 1)
    raise AssertionError("unreachable: the last look is final")


def right(kind: str, status: str) -> bool:
    return status == "confirmed" if EFFECTS[kind] >= 2 * SPEC.min_effect else status != "confirmed"


def first(outcome: Outcome) -> bool:
    """Decided at the first look (no round added)."""
    return outcome.rounds == 1 and outcome.status != "inconclusive"


def sweep_looks(kind: str) -> int:
    return TRIALS if kind.startswith("sweep") else 1


@dataclass
class Score:
    outcomes: dict[str, list[Outcome]] = field(default_factory=dict)

    def add(self, kind: str, outcome: Outcome) -> None:
        self.outcomes.setdefault(kind, []).append(outcome)

    def summary(self) -> dict:
        from scipy import stats

        every = [(k, o) for k, found in self.outcomes.items() for o in found]
        decided = [o for _, o in every if o.status != "inconclusive"]
        found = {}
        for kind in ("A/A", "A/A, min effect 0", "A/A, test noise 2x", "sweep A/A, best of 4"):
            aa = self.outcomes[kind]
            false = sum(o.status == "confirmed" for o in aa)
            interval = stats.binomtest(false, len(aa)).proportion_ci(0.95, method="exact")
            found[kind] = (false, len(aa), false / len(aa), [interval.low, interval.high])
        (false, count, rate, interval), any_effect = found["A/A"], found["A/A, min effect 0"]
        return {
            "accuracy": sum(right(k, o.status) for k, o in every) / len(every),
            "decided": len(decided) / len(every),
            "aa_false_confirmations": false,
            "aa_tests": count,
            "aa_rate": rate,
            "aa_interval": interval,
            "aa_any_effect": dict(zip(FIELDS, any_effect, strict=True)),
            "aa_other": {
                kind: dict(zip(FIELDS, found[kind], strict=True))
                for kind in ("A/A, test noise 2x", "sweep A/A, best of 4")
            },
            "seeds_per_test": float(np.mean([o.seeds for _, o in every])),
            "seeds_per_decided": float(np.mean([o.seeds for o in decided])) if decided else None,
            "tokens_per_decided": sum(o.tokens for _, o in every) / max(1, len(decided)),
            "by_kind": {
                k: {s: sum(o.status == s for o in found) / len(found) for s in STATUSES}
                for k, found in self.outcomes.items()
            },
            "rounds_by_kind": {
                k: {
                    "mean": float(np.mean([o.rounds for o in found])),
                    "decided_first": float(np.mean([first(o) for o in found])),
                }
                for k, found in self.outcomes.items()
            },
        }


STATUSES = ("confirmed", "rejected", "inconclusive")
FIELDS = ("confirmed", "tests", "rate", "interval")


def designs(alpha: float) -> dict[str, Design]:
    rules = {
        f"fixed k={START}": fixed(START, alpha),
        f"fixed k={CAP}": fixed(CAP, alpha),
    }
    for confirm, reject in (
        ("obrien_fleming", "pocock"),
        ("pocock", "pocock"),
        ("hwang_shih_decani", "pocock"),
    ):
        name = f"sequential {START}->{CAP} ({confirm}/{reject})"
        rules[name] = plan(START, CAP, alpha, confirm_spending=confirm, reject_spending=reject)
    return rules


def score(seed: int, families: int, aa: int) -> dict[str, dict]:
    """Every rule on the same draws of one random seed."""
    rng = np.random.default_rng(seed)
    rules = designs(load_params().alpha)
    scores = {name: Score() for name in rules}
    for kind, effect in EFFECTS.items():
        spec = ANY if kind == "A/A, min effect 0" else SPEC
        looks = sweep_looks(kind)
        for _ in range(aa if "A/A" in kind else families):
            baseline, test = draw(rng, effect, CAP, NOISIER.get(kind, 1.0), looks)
            for name, design in rules.items():
                scores[name].add(kind, sequence(design, baseline, test, spec, looks))
    return {name: s.summary() for name, s in scores.items()}


def table(results: dict[str, dict]) -> str:
    lines = [
        "| rule | accuracy | decided | A/A false confirmations (95% CI) | same, min effect 0 "
        "| seeds/test | seeds/decided | tokens/decided |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        low, high = r["aa_interval"]
        zero = r["aa_any_effect"]
        lines.append(
            f"| {name} | {r['accuracy']:.1%} | {r['decided']:.1%} | "
            f"{r['aa_false_confirmations']}/{r['aa_tests']} = {r['aa_rate']:.2%} "
            f"({low:.2%}–{high:.2%}) | {zero['confirmed']}/{zero['tests']} = {zero['rate']:.2%} "
            f"({zero['interval'][0]:.2%}–{zero['interval'][1]:.2%}) | "
            f"{r['seeds_per_test']:.2f} | {r['seeds_per_decided']:.2f} | "
            f"{r['tokens_per_decided']:.2f} |"
        )
    return "\n".join(lines)


def rate(found: dict) -> str:
    low, high = found["interval"]
    return f"{found['confirmed']}/{found['tests']} = {found['rate']:.2%} ({low:.2%}–{high:.2%})"


def large_table(results: dict[str, dict]) -> str:
    """The other nulls, and how soon large effects are decided (rounds: looks taken)."""
    lines = [
        "| rule | A/A, test noise 2x: false conf. | sweep A/A best of 4: false conf. "
        "| fix 48%: confirmed (at round 1), rounds | sweep fix 40%: confirmed (at round 1), "
        "rounds |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        cells = []
        for kind in ("fix 48%", "sweep fix 40%, best of 4"):
            rounds = r["rounds_by_kind"][kind]
            cells.append(
                f"{r['by_kind'][kind]['confirmed']:.1%} ({rounds['decided_first']:.1%}), "
                f"{rounds['mean']:.2f}"
            )
        other = r["aa_other"]
        lines.append(
            f"| {name} | {rate(other['A/A, test noise 2x'])} | "
            f"{rate(other['sweep A/A, best of 4'])} | {cells[0]} | {cells[1]} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", type=int, default=700, help="tests per non-A/A kind")
    parser.add_argument("--aa", type=int, default=2000, help="A/A tests")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.families < 1 or args.aa < 1:
        parser.error("--families and --aa must be at least 1")
    if args.json and not args.json.parent.is_dir():
        parser.error(f"--json {args.json}: folder {args.json.parent} does not exist")
    started = time.perf_counter()
    found = {"tuning (seed 1)": score(1, args.families, args.aa)}
    found["held-out (seed 2)"] = score(2, args.families, args.aa)
    for split, results in found.items():
        print(
            f"\n{split}: 4 x {args.aa} A/A + {5 * args.families} effect families, k0={START}, "
            f"cap {CAP}, sigma {SIGMA:.0%}, min effect {SPEC.min_effect:.0%}\n"
        )
        print(table(results))
        print()
        print(large_table(results))
    print(f"\n{time.perf_counter() - started:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
