"""What a confirmed fix did to triage's findings: for each finding on the baseline or on the fix,
the numbers that fire it before and after, and whether the fix moved them toward healthy.

Pure: two diagnosis documents (`hyprun diagnose`'s JSON: `findings`, `features`) and the table
rows in, plain records out. `hyprun verify` (runner/control/controller.py) words them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hyprun.diag.triage import Condition, Pattern

HEALTHY_WAY = {">": -1, ">=": -1, "<": 1, "<=": 1}
"""Which way a firing condition's value must move to stop firing: down for `>`, up for `<`."""


@dataclass
class Shift:
    """One number of a finding, measured on the baseline and on the fix."""

    feature: str
    before: Any
    after: Any
    condition: Condition | None = None
    """The table condition it fires on; None for a number the row only shows for context."""

    @property
    def way(self) -> str:
        """`toward healthy`, `away from healthy`, `not moved`, or "" (no direction: a shown
        number, an equality, or a value missing on one side)."""
        op = self.condition.op if self.condition else None
        measured = _is_json_number(self.before) and _is_json_number(self.after)
        if op not in HEALTHY_WAY or not measured:
            return ""
        before, after = float(self.before), float(self.after)
        if math.isclose(before, after, rel_tol=1e-9, abs_tol=0.0):
            return "not moved"
        return "toward healthy" if (after - before) * HEALTHY_WAY[op] > 0 else "away from healthy"

    def text(self) -> str:
        """`step_best_multiple 8 → 8 (fires when >= 8.0; not moved)`; a shown number without
        the parenthesis."""
        moved = f"{self.feature} {_number(self.before)} → {_number(self.after)}"
        if self.condition is None:
            return moved
        fires = f"fires when {self.condition.op} {self.condition.threshold}"
        return f"{moved} ({fires}; {self.way})" if self.way else f"{moved} ({fires})"


@dataclass
class FindingChange:
    """One finding across the fix: `gone` (fired on the baseline only), `still` (on both) or
    `new` (on the fix only), with the numbers behind it on both sides."""

    id: str
    status: str
    finding: dict[str, Any]
    """The finding as triage wrote it: on the fix when it still fires there, else the baseline's."""
    fires_on: list[Shift] = field(default_factory=list)
    """The numbers its row's conditions read."""
    measured: list[str] = field(default_factory=list)
    """How those numbers were measured on the fix (the features' details), when it still fires."""
    context: list[Shift] = field(default_factory=list)
    """The numbers its row shows beside them."""

    @property
    def way(self) -> str:
        """Where the fix moved the firing numbers, taken together: `toward healthy` when none
        moved away and one moved toward, `away from healthy` when none moved toward, `mixed`,
        or `not moved` (also when the row's numbers have no direction)."""
        ways = {s.way for s in self.fires_on} - {""}
        if "toward healthy" in ways:
            return "mixed" if "away from healthy" in ways else "toward healthy"
        return "away from healthy" if "away from healthy" in ways else "not moved"


def finding_changes(
    before: dict[str, Any], after: dict[str, Any], rows: dict[str, Pattern]
) -> list[FindingChange]:
    """Every finding of the baseline's document (`before`) and the fix's (`after`): the gone,
    then the still firing, then the new, each in triage's rank."""
    fired_before = {f["id"]: f for f in before.get("findings", [])}
    fired_after = {f["id"]: f for f in after.get("findings", [])}
    found = []
    for status, ids, source in (
        ("gone", [i for i in fired_before if i not in fired_after], fired_before),
        ("still", [i for i in fired_after if i in fired_before], fired_after),
        ("new", [i for i in fired_after if i not in fired_before], fired_after),
    ):
        for finding_id in ids:
            change = FindingChange(finding_id, status, source[finding_id])
            change.fires_on, change.context = _shifts(
                rows.get(finding_id), source[finding_id], before, after
            )
            if status != "gone":
                change.measured = [_value(after, s.feature, "detail") for s in change.fires_on]
                change.measured = [d for d in change.measured if d]
            found.append(change)
    return found


def _shifts(
    row: Pattern | None, finding: dict[str, Any], before: dict[str, Any], after: dict[str, Any]
) -> tuple[list[Shift], list[Shift]]:
    """(the row's conditions, its shown numbers) on both sides. A finding without a row (a
    failed L0 check triage reported on its own) has only the numbers it carries."""
    if row is None:
        names = list(finding.get("numbers", {}))
        return [], [Shift(n, _value(before, n), _value(after, n)) for n in names]
    fires_on = [
        Shift(c.feature, _value(before, c.feature, c.field), _value(after, c.feature, c.field), c)
        for c in row.conditions()
    ]
    read = {c.feature for c in row.conditions()}
    shown = [n for n in row.show if n not in read]
    return fires_on, [Shift(n, _value(before, n), _value(after, n)) for n in shown]


def _value(document: dict[str, Any], feature: str, part: str = "value") -> Any:
    """A measured feature's value (or L0 status) in a diagnosis document; None if unmeasured."""
    return (document.get("features", {}).get(feature) or {}).get(part)


def _is_json_number(value: Any) -> bool:
    """A number as a diagnosis document holds one (JSON: int or float, never a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: Any) -> str:
    if _is_json_number(value):
        return f"{float(value):.3g}"
    return "unmeasured" if value is None else str(value)
