"""Whether a card would change anything in a given resolved config.

A card whose delta sets every key to the value the config already has (`pre_norm` on a model
that is already pre-norm) costs a test and, when it is rejected, a strike, for nothing: it is
never suggested. Only what can be read from the resolved config is judged; a config-group
choice (`sched=wsd`), a relative value (`*F`, which changes any nonzero value) or a key the
config lacks always counts as a change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from hyprun.hypotheses.schema import OVERRIDE, Card

_MISSING = object()


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _same(current: Any, wanted: Any) -> bool:
    if isinstance(current, bool) or isinstance(wanted, bool):
        return current is wanted
    if isinstance(current, int | float) and isinstance(wanted, int | float):
        return float(current) == float(wanted)
    if isinstance(current, list | tuple) and isinstance(wanted, list | tuple):
        return len(current) == len(wanted) and all(map(_same, current, wanted))
    return current == wanted


def unchanged_by(card: Card, config: Mapping[str, Any]) -> str | None:
    """Why the card's delta would change nothing in `config` ("model.placement is already
    'pre'"), or None when it changes something (or that cannot be told from the config)."""
    reasons = []
    for entry in card.delta:
        match = OVERRIDE.match(entry)
        if match is None or match["add"] or match["value"].startswith("*"):
            return None
        current = _lookup(config, match["key"])
        wanted = yaml.safe_load(match["value"])
        if current is _MISSING or isinstance(current, Mapping) or not _same(current, wanted):
            return None
        reasons.append(f"{match['key']} is already {current!r}")
    return "; ".join(reasons) or None
