"""A user's app's test refused before it takes a number: what hyprun can tell from the app's
composed config without running it.

The app itself would only crash on bad input after seconds to minutes of imports and setup (an
HF Trainer with `learning_rate=abc`: 30-55 s to an `error`, a test number spent). So before a
test is claimed, each override of the test is checked against the app's baseline config:

- a value of another type than the key's baseline value (`abc` where the baseline has 0.003);
- a new `+key` that nothing says the app reads: only a knob's key, or a field of the class a
  knob preset's node is read into (`+training.foo`: TrainingArguments has no field `foo`);
- a knob's value outside the values the knob may take (`training.learning_rate=-1`);
- a declared key the test's config no longer holds (HydraApp.check);
- whatever the app's own `preflight:` function (hyprun.yaml) raises on the composed config.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hyprun.hypotheses.applies import MISSING, lookup
from hyprun.hypotheses.schema import OVERRIDE
from hyprun.runner.compose import one_line
from hyprun.runner.errors import BadInput
from hyprun.runner.launch.knobs import PREFIX, PRESET, Knob, load_knobs, value_problem


def kind(value: Any) -> str:
    """A config value's kind in words."""
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return "a string"


def type_problem(before: Any, after: Any, knob: Knob | None) -> str | None:
    """Why `after` cannot stand where the baseline has `before` (None: it can). A string may
    take a number (Hydra reads `16` as one; Lightning's precision takes both); a whole number
    takes a fraction only where a knob says the key is a number (HF's warmup_steps)."""
    if before is None or after is None:
        return None
    if kind(before) == "a string":
        return None if kind(after) in ("a string", "a number") else kind(before)
    if kind(before) != kind(after):
        return kind(before)
    whole = isinstance(before, int) and not isinstance(before, bool)
    fraction = isinstance(after, float) and not after.is_integer()
    if whole and fraction and (knob is None or knob.values is not None):
        return "a whole number"
    return None


def library_fields(target: str) -> set[str] | None:
    """The keyword arguments `module:Class` takes: a dataclass's fields and its __init__'s
    parameters, read from its source file when it defines them itself (importing the library
    imports torch: 10-20 s on a loaded machine for a one-line refusal), else from the imported
    class; None when the library is not here (then nothing is refused)."""
    module, _, name = target.partition(":")
    found = fields_in_source(module, name)
    if found is not None:
        return found
    try:
        imported = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    if dataclasses.is_dataclass(imported):
        return {field.name for field in dataclasses.fields(imported)}
    return set(inspect.signature(imported.__init__).parameters) - {"self"}


def fields_in_source(module: str, name: str) -> set[str] | None:
    """A class's annotated fields and __init__ parameters from the module's file, found on
    sys.path without importing its package; None when not found or the class has bases (its
    fields may be inherited)."""
    relative = Path(*module.split("."))
    for entry in map(Path, filter(None, sys.path)):
        source = (entry / relative).with_suffix(".py")
        if source.is_file():
            break
    else:
        return None
    tree = ast.parse(source.read_text())
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None or node.bases:
        return None
    fields = {
        s.target.id
        for s in node.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    }
    for method in node.body:
        if isinstance(method, ast.FunctionDef) and method.name == "__init__":
            arguments = method.args.posonlyargs + method.args.args + method.args.kwonlyargs
            fields |= {argument.arg for argument in arguments} - {"self"}
    return fields


def unread(key: str, knobs: Mapping[str, Knob], declared: Mapping[str, str]) -> str | None:
    """Why nothing would read the new key `key` (None: something does)."""
    if any(knob.key == key for knob in knobs.values()):
        return None
    prefix = declared.get(PREFIX)
    if prefix and key.startswith(prefix + "."):
        preset = load_knobs().presets[declared[PRESET]]
        field = key[len(prefix) + 1 :].split(".")[0]
        fields = library_fields(preset.reads)
        if fields is None or field in fields:
            return None
        return f"{preset.reads} has no field {field!r}: nothing would read it; fix the spelling"
    return (
        "it is not in the app's config, so nothing says the app reads it: add it to the app's "
        "config first (or declare it as a knob in hyprun.yaml), or fix the spelling"
    )


def check_overrides(
    overrides: tuple[str, ...],
    baseline: Mapping[str, Any],
    test: Mapping[str, Any],
    knobs: Mapping[str, Knob],
    declared: Mapping[str, str],
    groups: set[str],
) -> None:
    """BadInput for the first override of a test that the app could not take (see above)."""
    by_key = {knob.key: knob for knob in knobs.values()}
    for override in overrides:
        match = OVERRIDE.match(override)
        if match is None or match["key"] in groups:  # a group choice: Hydra found its file
            continue
        key = match["key"]
        before, after = lookup(baseline, key), lookup(test, key)
        if before is MISSING:
            problem = unread(key, knobs, declared)
            if problem:
                raise BadInput(f"{override}: {key} is new: {problem}")
        else:
            wanted = type_problem(before, after, by_key.get(key))
            if wanted:
                raise BadInput(
                    f"{override}: the app's baseline has {key}: {before!r}, {kind(before)}: "
                    f"give {wanted}"
                )
        problem = value_problem(by_key[key], after) if key in by_key else None
        if problem:
            raise BadInput(f"{override}: {problem}")


def call_preflight(target: str, cfg: DictConfig, declared_in: str) -> None:
    """The app's own check of a composed config (no training); its exception refuses."""
    module, _, name = target.partition(":")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # as the app's own run imports it
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise BadInput(
            f"{declared_in}: preflight {target} cannot be imported ({one_line(error)}): "
            "fix the name"
        ) from None
    try:
        function(cfg)
    except Exception as error:
        raise BadInput(
            f"the app's preflight ({target}) refused the config: "
            f"{type(error).__name__}: {one_line(error)[:300]}"
        ) from None
