"""How far past healthy each cut of the triage tables sits: `python -m bench.margins`.

For every ordering condition of a training row (Q1, Q2) on a feature the healthy reference
measures (diag/tables/healthy_reference.yaml), the cut against the healthy extreme on its side:
`threshold / healthy max` for a `>` cut, `healthy min / threshold` for a `<` cut, where both are
positive; else the distance past the extreme in healthy ranges (`(threshold - max) / (max -
min)`), marked "+". A margin under 1 is a cut inside the healthy range: the row is held off the
healthy runs by its other conditions only. This is what issue 27's "one cut shared by all rows"
would have to reconcile: a single cut on a common scale fires a row whose margin is below it
more often on healthy runs, and misses faults between it and a row's own margin.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from hyprun.diag.reference import Reference, load_reference
from hyprun.diag.triage import load_tables

ABOVE, BELOW = (">", ">="), ("<", "<=")


@dataclass
class Cut:
    row: str
    feature: str
    op: str
    threshold: float
    healthy: tuple[float, float, int]
    """(min, max, runs) of the healthy reference."""
    margin: float
    ratio: bool
    """Whether `margin` is a ratio (both positive) or a distance in healthy ranges."""


def margin(op: str, threshold: float, low: float, high: float) -> tuple[float, bool]:
    """The cut's margin past the healthy extreme on its side, and whether it is a ratio."""
    if op in ABOVE:
        if threshold > 0 and high > 0:
            return threshold / high, True
        return (threshold - high) / ((high - low) or 1.0), False
    if threshold > 0 and low > 0:
        return low / threshold, True
    return (low - threshold) / ((high - low) or 1.0), False


def cuts(reference: Reference | None = None) -> list[Cut]:
    """Every ordering cut of a Q1/Q2 row on a feature the reference measures."""
    reference = reference or load_reference()
    out = []
    for row in load_tables():
        if row.question not in ("Q1", "Q2"):
            continue
        for condition in row.conditions():
            values = reference.values(condition.feature)
            if condition.field != "value" or condition.op not in ABOVE + BELOW or not values:
                continue
            low, high = min(values), max(values)
            found, ratio = margin(condition.op, float(condition.threshold), low, high)
            healthy = (low, high, len(values))
            out.append(
                Cut(
                    row.id,
                    condition.feature,
                    condition.op,
                    condition.threshold,
                    healthy,
                    found,
                    ratio,
                )
            )
    return sorted(out, key=lambda cut: (not cut.ratio, cut.margin))


def render(found: list[Cut]) -> str:
    lines = [
        "| row | cut | healthy (runs) | margin |",
        "| --- | --- | --- | --- |",
    ]
    for cut in found:
        low, high, runs = cut.healthy
        shown = f"{cut.margin:.3g}x" if cut.ratio else f"+{cut.margin:.3g} ranges"
        lines.append(
            f"| {cut.row} | {cut.feature} {cut.op} {cut.threshold:g} | "
            f"{low:.3g} to {high:.3g} ({runs}) | {shown} |"
        )
    ratios = [cut.margin for cut in found if cut.ratio]
    inside = [cut for cut in found if cut.margin < (1 if cut.ratio else 0)]
    if ratios:
        spread = max(ratios) / min(ratios)
        lines += [
            "",
            f"{len(found)} cuts; ratio margins {min(ratios):.3g}x to {max(ratios):.3g}x "
            f"(a spread of {spread:.3g}x, {math.log10(spread):.1f} decades); "
            f"{len(inside)} inside the healthy range (held off by their other conditions)",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m bench.margins", description=__doc__).parse_args(argv)
    print(render(cuts()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
