"""How `hyprun verify` words what a confirmed fix did to triage's findings (the numbers come from
diag/fixed.py): the finding the fix was tested for and is gone, one that survived it with its
numbers before and after and the next step, another finding the fix never touched, a new one."""

from __future__ import annotations

from typing import Any

from hyprun.diag.fixed import FindingChange
from hyprun.hypotheses.schema import Card
from hyprun.runner.store.investigation import Test


def finding_cards(finding: dict[str, Any], cards: dict[str, Card]) -> list[str]:
    """The cards that test a finding: its row's, then those that name it as their trigger. On a
    user's app (the finding carries `deltas`, runner/control/diagnose.py) only the cards that
    translate into its keys: another needs a knob the app has not declared."""
    named = list(finding.get("cards", []))
    if "deltas" in finding:
        return named
    return named + [
        c.id for c in cards.values() if finding["id"] in c.triggers and c.id not in named
    ]


def card_keys(card_ids: list[str], cards: dict[str, Card]) -> list[str]:
    """The config keys those cards change."""
    return sorted({entry.split("=")[0] for c in card_ids if c in cards for entry in cards[c].delta})


def tested_for(test: Test, finding: dict[str, Any], cards: dict[str, Card]) -> bool:
    """Whether the test was a test of this finding: it ran one of the finding's cards, or
    changed a key those cards change (a plain override of the same variable)."""
    testing = finding_cards(finding, cards)
    return test.card in testing or test.variable in card_keys(testing, cards)


def fixed_lines(
    test: Test, found: list[FindingChange], cards: dict[str, Card], promoted: bool
) -> list[str]:
    """One line per finding across the fix, then what to do next."""
    name = f"H{test.number}"
    lines = [f"verify {name} ({' '.join(test.fix)}): triage on the fix's seed 0 vs the baseline's"]
    for change in found:
        numbers = "; ".join(s.text() for s in change.fires_on + change.context) or "no numbers"
        mine = tested_for(test, change.finding, cards)
        lines.append(f"  {_heading(name, change, mine)}: {numbers}")
        lines += [f"    measured on the fix: {detail}" for detail in change.measured]
        if change.status != "gone":
            lines.append(f"    {_next(name, change, mine, cards, promoted)}")
    if len(lines) == 1:
        lines.append("  no finding fired on the baseline or on the fix")
    return lines


def _heading(name: str, change: FindingChange, mine: bool) -> str:
    finding = change.id
    if change.status == "gone":
        return f"gone: {finding}" + (f", which {name} was tested for" if mine else "")
    if change.status == "new":
        return f"new on the fix: {finding}"
    if mine:
        return f"still firing: {finding}, which {name} was tested for too ({change.way})"
    return f"still firing: {finding}, another finding: {name} did not test it ({change.way})"


def _next(name: str, change: FindingChange, mine: bool, cards: dict[str, Card], promoted: bool):
    """What the surviving (or new) finding says now, and the step that tests it."""
    finding = change.finding
    testing = [c for c in finding_cards(finding, cards) if c in cards]
    cause = finding.get("cause", "")
    if mine and change.way == "toward healthy":
        said = f"{name} moved it toward healthy, not past the threshold: {cause} may still hold"
    elif mine and change.way == "not moved":
        said = f"{name} did not move it: {cause} may still hold"
    elif mine:
        said = f"{name} moved it away from healthy: its cause ({cause}) is not what {name} fixed"
    else:
        said = f"{cause}: {finding.get('first_action', '')}"
    if not testing:
        return f"{said}; no card tests it: a human checks"
    delta = finding.get("deltas", {}).get(testing[0])
    runs = f" (runs {' '.join(delta)})" if delta else ""
    test_it = f"'hyprun test {testing[0]} --why ...'{runs}"
    if promoted:
        return f"{said}; next, on the fixed config (now the baseline): {test_it}"
    return f"{said}; next: 'hyprun verify {name} --promote', then {test_it} on the fixed config"
