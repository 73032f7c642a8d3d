"""Hyprun's cards as one-variable deltas on a corpus app, translated by hyprun itself: the knobs
the app declares in its hyprun.yaml (runner/launch/knobs.py), relative values resolved against
the config (runner/control/one_variable.py), as `hyprun test CARD` would run them."""

from __future__ import annotations

from pathlib import Path

import yaml
from omegaconf import OmegaConf

from bench.corpus.compose import APPS, app_config


def applicable(form: str, overrides: list[str], folder: Path | None = None) -> dict[str, list[str]]:
    """Every card that changes this config: {card id: its overrides, resolved}; the app in
    `folder` (default: the corpus's app of that form)."""
    from hyprun.hypotheses.schema import load_cards
    from hyprun.runner.control.one_variable import resolve_relative
    from hyprun.runner.launch.declaration import load_declaration
    from hyprun.runner.launch.knobs import resolve, translate

    folder = folder or Path(APPS, form)
    knobs = resolve(load_declaration(folder / "hyprun.yaml").knobs)
    config = OmegaConf.to_container(app_config(form, overrides, folder))
    out = {}
    for card_id, card in sorted(load_cards().items()):
        translation = translate(card, knobs, config)
        if card.primary.metric != "eval/loss":  # a throughput card fixes no loss
            continue
        if translation.reason or translation.noop or not translation.overrides:
            continue
        resolved = resolve_relative(config, list(translation.overrides))
        if any(_changes(config, override) for override in resolved):
            out[card_id] = resolved
    return out


def _changes(config: dict, override: str) -> bool:
    key, _, value = override.partition("=")
    current = OmegaConf.select(OmegaConf.create(config), key.lstrip("+"))
    return current != yaml.safe_load(value)
