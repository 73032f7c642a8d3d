"""Whether a card would change anything in a given resolved config.

A card whose delta sets every key to the value the config already has (`pre_norm` on a model
that is already pre-norm) costs a test and, when it is rejected, a strike, for nothing: it is
never suggested. Only what can be read from the resolved config is judged; a config-group
choice (`sched=wsd`), a relative value on a nonzero value (`*F`) or a key the config lacks
always counts as a change. A card translated into an app's own keys (runner/launch/knobs.py) is
judged by its translated overrides, on the app's config. Which way a card scales a key is read
here too, so that a card undoing a stronger finding's card is not proposed after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from hyprun.hypotheses.schema import OVERRIDE, Card, relative_factor

MISSING = object()
"""What `lookup` returns for a key the config does not hold (a null value is held)."""


def lookup(config: Mapping[str, Any], dotted: str) -> Any:
    """The value at a dotted key of a plain config tree, or MISSING."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return node


def same(current: Any, wanted: Any) -> bool:
    """Equal as config values: 1 == 1.0, but True is not 1."""
    if isinstance(current, bool) or isinstance(wanted, bool):
        return current is wanted
    if isinstance(current, int | float) and isinstance(wanted, int | float):
        return float(current) == float(wanted)
    if isinstance(current, list | tuple) and isinstance(wanted, list | tuple):
        return len(current) == len(wanted) and all(map(same, current, wanted))
    return current == wanted


def unchanged(delta: Sequence[str], config: Mapping[str, Any]) -> str | None:
    """Why the overrides would change nothing in `config` ("model.placement is already
    'pre'"), or None when they change something (or that cannot be told from the config)."""
    reasons = []
    for entry in delta:
        match = OVERRIDE.match(entry)
        if match is None or match["add"]:
            return None
        current = lookup(config, match["key"])
        if match["value"].startswith("*"):
            if not _is_zero(current):
                return None
            reasons.append(f"{match['key']} is 0, and {match['value']} of 0 is still 0")
            continue
        wanted = yaml.safe_load(match["value"])
        if current is MISSING or isinstance(current, Mapping) or not same(current, wanted):
            return None
        reasons.append(f"{match['key']} is already {current!r}")
    return "; ".join(reasons) or None


def _is_zero(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


def directions(card: Card) -> dict[str, int]:
    """The keys `card` scales by a relative value, each with +1 (`*10`: up) or -1 (`*0.1`:
    down); a key set to a plain value has no direction."""
    moves = {}
    for entry in card.delta:
        match = OVERRIDE.match(entry)
        factor = relative_factor(match["value"]) if match else None
        if factor is not None and factor != 1:
            moves[match["key"]] = 1 if factor > 1 else -1
    return moves


def reversed_key(card: Card, other: Card) -> str | None:
    """A key that `card` moves the opposite way from `other` (lr_up_10x against lr_down_10x:
    `optim.lr`), or None."""
    mine, theirs = directions(card), directions(other)
    return next((key for key in mine if theirs.get(key, mine[key]) != mine[key]), None)


def unchanged_by(card: Card, config: Mapping[str, Any]) -> str | None:
    """Why the card's delta would change nothing in our job's `config`, or None."""
    return unchanged(card.delta, config)
