"""Knobs: the cards' vocabulary in a user's app's own keys.

A card names hyprun's keys (`optim.lr=*10`). An app declares in hyprun.yaml which of its keys
each knob is, one by one or through a library's preset under a prefix:

    knobs: {preset: hf, prefix: training, optim.lr: training.learning_rate}

and a card whose every key is mapped applies to the app: its delta is translated key by key
(`training.learning_rate=*10`; a relative value scales the app's baseline value, or the library's
default when the app's config leaves the key out), then judged like any override by the
one-variable rule. A card that does not translate says why, and names the knob to declare.

The vocabulary (each knob with the values a run may give it) and the presets are data, in
knobs.yaml next to this file, validated here. Pure: no Hydra, MLflow or app imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from hyprun.diag.schema import Strict, validated
from hyprun.hypotheses.applies import MISSING, lookup, same
from hyprun.hypotheses.schema import OVERRIDE, Card, relative_factor

KNOBS_FILE = Path(__file__).with_name("knobs.yaml")
PRESET, PREFIX = "preset", "prefix"
"""The two entries of hyprun.yaml's `knobs:` that are not knobs."""
Scalar = float | int | bool | str | None


class Values(Strict):
    """What a knob is and the values a run may give it."""

    about: str
    """The knob in words, for refusals ("the learning rate")."""
    type: Literal["number", "integer", "boolean", "choice", "list"]
    min: float | None = None
    """Inclusive lower bound."""
    above: float | None = None
    """Exclusive lower bound."""
    max: float | None = None
    """Inclusive upper bound."""
    below: float | None = None
    """Exclusive upper bound."""


class PresetKnob(Strict):
    """One knob of a preset: a field of the library's class."""

    key: str
    """The field, below the prefix the app declares."""
    default: Scalar
    """The library's default, for an app whose config leaves the field out (null: unset)."""
    values: dict[str, Scalar] | None = None
    """Card value -> the library's value, where the vocabularies differ."""
    wider: bool = False
    """The field takes more than the knob's values (HF's warmup_steps: a fraction, or whole
    steps): a value is then checked against the baseline's type only, not the knob's range."""


class Preset(Strict):
    """A library whose keyword arguments an app keeps under one node of its config."""

    about: str
    reads: str = Field(pattern=r"^[\w.]+:\w+$")
    """`module:Class` whose dataclass fields or __init__ parameters the node is read into."""
    knobs: dict[str, PresetKnob]


class KnobsFile(Strict):
    """The schema of knobs.yaml."""

    vocabulary: dict[str, Values]
    presets: dict[str, Preset]


@lru_cache
def load_knobs(path: Path = KNOBS_FILE) -> KnobsFile:
    """knobs.yaml, validated; every preset knob must be in the vocabulary."""
    table = validated(KnobsFile, yaml.safe_load(path.read_text()), str(path))
    for name, preset in table.presets.items():
        unknown = sorted(set(preset.knobs) - set(table.vocabulary))
        if unknown:
            raise ValueError(f"{path}: presets.{name}: {unknown[0]} is not in the vocabulary")
    return table


@dataclass(frozen=True)
class Knob:
    """One knob as an app maps it."""

    name: str
    """The card's key (`optim.lr`)."""
    key: str
    """The app's key (`training.learning_rate`)."""
    source: str
    """Where the mapping comes from: `hyprun.yaml`, or `preset hf`."""
    default: Scalar = None
    """The library's default when the app's config lacks the key (presets only)."""
    values: Mapping[str, Scalar] | None = None
    """Card value -> app value; None: the card's value is the app's."""
    wider: bool = False
    """The app's key takes values the knob's range does not hold (see PresetKnob.wider)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "source": self.source,
            "default": self.default,
            "values": dict(self.values) if self.values is not None else None,
            "wider": self.wider,
        }


def declared_problem(declared: Mapping[str, str]) -> str | None:
    """What is wrong with hyprun.yaml's `knobs:` (in words, with the fix), or None."""
    table = load_knobs()
    preset, prefix = declared.get(PRESET), declared.get(PREFIX)
    if preset is not None and preset not in table.presets:
        return f"knobs.preset: no preset {preset!r}: choose one of {', '.join(table.presets)}"
    if (preset is None) != (prefix is None):
        return "knobs: preset and prefix go together: name the node your app passes to it"
    for name, key in declared.items():
        if name in (PRESET, PREFIX):
            continue
        if name not in table.vocabulary:
            return (
                f"knobs.{name} is not a knob the cards use: choose among "
                f"{', '.join(sorted(table.vocabulary))}"
            )
        if not isinstance(key, str) or not OVERRIDE.match(f"{key}=0"):
            return f"knobs.{name}: {key!r} is not a key of a config: write e.g. training.lr"
    return None


def resolve(declared: Mapping[str, str]) -> dict[str, Knob]:
    """Each knob the app maps: the preset's under its prefix, then the explicit entries (which
    win)."""
    knobs: dict[str, Knob] = {}
    name = declared.get(PRESET)
    if name is not None:
        preset = load_knobs().presets[name]
        for knob, field in preset.knobs.items():
            key = f"{declared[PREFIX]}.{field.key}"
            knobs[knob] = Knob(
                knob, key, f"preset {name}", field.default, field.values, field.wider
            )
    for knob, key in declared.items():
        if knob not in (PRESET, PREFIX):
            knobs[knob] = Knob(knob, key, "hyprun.yaml")
    return knobs


def from_dicts(found: Mapping[str, Mapping[str, Any]]) -> dict[str, Knob]:
    """Knobs as `Knob.as_dict` wrote them (a seed run's `hyprun.knobs` tag)."""
    return {name: Knob(name, **entry) for name, entry in found.items()}


@dataclass(frozen=True)
class Translation:
    """A card's delta in an app's keys, or why it does not apply."""

    overrides: tuple[str, ...] = ()
    missing: str | None = None
    """The card's knob the app does not map (declare it in hyprun.yaml)."""
    reason: str | None = None
    """Why the card does not apply (in words, with the fix), or None when it does."""
    noop: str | None = None
    """Why it would change nothing (the library's default is already the card's value)."""


def translate(card: Card, knobs: Mapping[str, Knob], baseline: Mapping[str, Any]) -> Translation:
    """`card`'s delta in the app's keys, given its resolved baseline config."""
    overrides, noop = [], []
    for entry in card.delta:
        match = OVERRIDE.match(entry)
        if match is None:  # the card schema admits only overrides: cannot happen for a card
            return Translation(reason=f"{entry!r} is not an override")
        name, value = match["key"], match["value"]
        knob = knobs.get(name)
        if knob is None:
            return Translation(
                missing=name,
                reason=f"needs the knob {name}: declare knobs: {{{name}: <your key>}} in "
                "hyprun.yaml",
            )
        present = lookup(baseline, knob.key) is not MISSING
        if relative_factor(value) is not None:
            if present:
                overrides.append(f"{knob.key}={value}")
                continue
            if isinstance(knob.default, bool) or not isinstance(knob.default, int | float):
                return Translation(
                    reason=f"{knob.key} is not in your config and its default is "
                    f"{knob.default!r}: '{value}' has nothing to scale; set it in your config"
                )
            scaled = float(f"{knob.default * relative_factor(value):.6g}")
            value = str(
                int(scaled) if isinstance(knob.default, int) and scaled.is_integer() else scaled
            )
        elif knob.values is not None:
            if value not in knob.values:
                return Translation(
                    reason=f"{name}={value} has no counterpart in {knob.source}'s {knob.key} "
                    f"(it maps {', '.join(knob.values)})"
                )
            value = written(knob.values[value])
        if not present and knob.default is not None and same(knob.default, yaml.safe_load(value)):
            noop.append(f"{knob.key} is already {knob.default!r}, the default of {knob.source}")
        overrides.append(f"{'' if present else '+'}{knob.key}={value}")
    return Translation(tuple(overrides), noop="; ".join(noop) or None)


def written(value: Scalar) -> str:
    """A value as a Hydra override writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def value_problem(knob: Knob, value: Any) -> str | None:
    """Why `value` is not one the knob may take (in words), or None. A knob whose values the
    app spells its own way (a preset's `values:`), or whose key takes more (`wider`), is judged
    by the app's own value's type."""
    if knob.values is not None or knob.wider:
        return None
    spec = load_knobs().vocabulary[knob.name]
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if spec.type in ("number", "integer") and not number:
        return f"{spec.about} ({knob.name}) is a number"
    if spec.type == "integer" and not float(value).is_integer():
        return f"{spec.about} ({knob.name}) is a whole number"
    if spec.type == "boolean" and not isinstance(value, bool):
        return f"{spec.about} ({knob.name}) is true or false"
    if spec.type == "list" and not isinstance(value, list | tuple):
        return f"{spec.about} ({knob.name}) is a list"
    if not number:
        return None
    bounds = (
        (spec.min, value >= (spec.min or 0), ">="),
        (spec.above, value > (spec.above or 0), ">"),
        (spec.max, value <= (spec.max or 0), "<="),
        (spec.below, value < (spec.below or 0), "<"),
    )
    for bound, holds, sign in bounds:
        if bound is not None and not holds:
            return f"{spec.about} ({knob.name}) must be {sign} {bound:g}"
    return None
