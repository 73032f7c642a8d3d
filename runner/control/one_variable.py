"""The one-variable rule: what a hypothesis changes, measured on resolved configs.

A hypothesis is a list of Hydra overrides applied on top of the baseline's. Both are composed and
their trees diffed twice: unresolved (what was *set*) and resolved (what *follows*). A leaf that
changed only after resolution is derived by interpolation and rides along with its source. The
independent changes must form one variable: a single leaf, or a single config-group choice with
its own subtree (`sched=wsd` swaps the whole `sched` node).

A group switch is one variable only for what is the group's own: keys one choice has and the
other lacks (SGD's momentum, AdamW's betas), and its `_target_`. A key both choices share whose
value changes (`optim.lr` 1e-3 -> 0.1 when AdamW becomes SGD's preset) is a variable of its own:
the switch is refused naming those keys, with the pinned form that holds them at the baseline's
values (`optim=sgd optim.lr=0.001 optim.weight_decay=0.1`), unless a card declares the switch a
compound intervention (`compound:` in the card, with the reason); then the test is one
intervention of several changes and is labelled compound wherever it shows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from hyprun.hypotheses.schema import relative_factor
from hyprun.runner.compose import check_overrides, compose
from hyprun.runner.errors import BadInput
from hyprun.runner.launch.app import HydraApp

CONTROLLED = Path(__file__).with_name("controlled.yaml")


@dataclass(frozen=True)
class Delta:
    """What a hypothesis changes relative to the baseline."""

    overrides: tuple[str, ...]
    """The hypothesis's own overrides, with relative values (`*0.1`) made absolute."""
    variable: str
    """The one variable: a dotted leaf (`optim.lr`) or a config group (`sched`)."""
    changes: dict[str, tuple[Any, Any]]
    """Every changed resolved leaf: key -> (baseline value, hypothesis value)."""
    derived: tuple[str, ...]
    """Leaves that changed only through interpolation."""
    compound: tuple[str, ...] = ()
    """A compound group switch (declared by a card): the shared keys it changes too."""

    def describe(self) -> str:
        if self.variable in self.changes:
            before, after = self.changes[self.variable]
            return f"{self.variable} {before}\u2192{after}"  # `optim.lr 1e-05→0.001`
        label = "compound " if self.compound else ""
        return f"{label}{self.variable}: " + " ".join(self.overrides)


@lru_cache
def _rules() -> dict[str, Any]:
    return yaml.safe_load(CONTROLLED.read_text())


def config_groups() -> set[str]:
    """Names of the config groups (folders of conf/) a `group=choice` override can switch."""
    from importlib.resources import files

    root = files("hyprun.conf")
    return {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")}


def resolve_relative(baseline: dict[str, Any], overrides: list[str]) -> list[str]:
    """`optim.lr=*0.1` -> `optim.lr=<baseline lr x 0.1>`: card deltas relative to the baseline."""
    resolved = []
    for override in overrides:
        key, _, value = override.partition("=")
        try:
            factor = relative_factor(value)
        except ValueError as err:
            raise BadInput(f"{override}: {err}") from None
        if factor is not None:
            current = OmegaConf.select(OmegaConf.create(baseline), key.lstrip("+~"))
            if not isinstance(current, int | float) or isinstance(current, bool):
                raise BadInput(f"{override}: '*F' scales a number, but {key} is {current!r}")
            scaled = float(f"{current * factor:.6g}")  # 1e-06, not 1.0000000000000002e-06
            if isinstance(current, int) and scaled.is_integer():
                scaled = int(scaled)
            override = f"{key}={scaled!r}"
        resolved.append(override)
    return resolved


def measure(
    baseline_overrides: list[str],
    hypothesis: list[str],
    app: HydraApp | None = None,
    compound: bool = False,
) -> Delta:
    """The Delta of `hypothesis` on top of the baseline, or BadInput when it is not exactly one
    uncontrolled variable (the message names every changed key and suggests the split).
    `app`: a user's Hydra app, whose own tree and declared controlled keys are used instead.
    `compound`: a card declared its group switch one intervention of several changes."""
    check_overrides(hypothesis)
    for override in hypothesis:
        if override.startswith("~"):
            raise BadInput(
                f"{override} deletes a key: a hypothesis sets a value, e.g. {_key(override)}=VALUE"
            )
    compose_tree = app.compose if app else compose
    rules = app.rules() if app else _rules()
    base_cfg = compose_tree(baseline_overrides)
    base = OmegaConf.to_container(base_cfg, resolve=True)
    hypothesis = resolve_relative(base, hypothesis)
    test_cfg = compose_tree([*baseline_overrides, *hypothesis])
    test = OmegaConf.to_container(test_cfg, resolve=True)
    resolved = _diff(base, test)
    raw = _diff(
        OmegaConf.to_container(base_cfg, resolve=False),
        OmegaConf.to_container(test_cfg, resolve=False),
    )
    ignored = rules["ignored"]
    independent = {k for k in raw if not any(_under(k, i) for i in ignored)}
    changes = {k: v for k, v in resolved.items() if not any(_under(k, i) for i in ignored)}
    if not changes:
        raise BadInput(
            f"the delta {' '.join(hypothesis)} changes nothing in the resolved config: "
            "a hypothesis must change one variable"
        )
    for rule in rules["controlled"]:
        touched = sorted(k for k in independent if _under(k, rule["prefix"]))
        if touched:
            raise BadInput(
                f"{', '.join(touched)} is a controlled variable ({rule['why']}): "
                "a hypothesis may not change it; record a new baseline instead"
            )
    unread = sorted(k for k in independent if k.split(".")[0] not in base)
    if unread and app is None:  # an app may read what it likes; the built-in job does not
        raise BadInput(
            f"{unread[0]} is not part of the job's config: nothing would read it "
            "(check the spelling against `python -m hyprun.runner.job.train --cfg job`)"
        )
    groups = app.groups() if app else config_groups()
    variables = _variables(independent, hypothesis, groups)
    if len(variables) != 1:
        raise BadInput(
            f"the delta changes {len(variables)} variables ({', '.join(sorted(variables))}): "
            "test one at a time, e.g. "
            + " then ".join(f"'hyprun test {v}'" for v in _split(hypothesis, variables))
        )
    variable = variables.pop()
    shared = _shared_changes(variable, changes, hypothesis, groups, (base, test))
    if shared and not compound:
        pinned = [*hypothesis, *(f"{k}={_value(changes[k][0])}" for k in shared)]
        raise BadInput(
            f"{variable} switch also changes {', '.join(shared)}, which both choices share: "
            f"each is a variable of its own; hold them at the baseline's values with "
            f"'hyprun test {' '.join(pinned)}', or use a card that declares the switch compound"
        )
    derived = tuple(sorted(k for k in changes if k not in independent))
    return Delta(tuple(hypothesis), variable, changes, derived, shared if compound else ())


def _shared_changes(
    variable: str,
    changes: dict[str, tuple[Any, Any]],
    hypothesis: list[str],
    groups: set[str],
    trees: tuple[dict, dict],
) -> tuple[str, ...]:
    """For a group switch: the changed keys both choices have (not `_target_`, the choice
    itself). A key only one choice has belongs to the switch."""
    if variable not in {_key(o) for o in hypothesis} or variable not in groups:
        return ()
    return tuple(
        sorted(
            key
            for key in changes
            if key.startswith(variable + ".")
            and not key.endswith("._target_")
            and all(_has(tree, key) for tree in trees)
        )
    )


def _has(tree: dict, dotted: str) -> bool:
    """Whether the config tree holds the key (a null value is held; an absent key is not)."""
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def _value(value: Any) -> str:
    """A config value written back as a Hydra override value."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _under(key: str, prefix: str) -> bool:
    """Whether a dotted key is `prefix` or lies below it; a prefix ending in '.' or '_'
    (`budget.`, `data.source.heldout_`) matches every key that starts with it."""
    if prefix.endswith((".", "_")):
        return key.startswith(prefix)
    return key == prefix or key.startswith(prefix + ".")


def _variables(independent: set[str], hypothesis: list[str], groups: set[str]) -> set[str]:
    """Group choices count once with everything under their node; other leaves count each."""
    chosen = {_key(o) for o in hypothesis if _key(o) in groups}
    variables = set(chosen)
    for key in independent:
        if not any(key == g or key.startswith(g + ".") for g in chosen):
            variables.add(key)
    return variables


def _split(hypothesis: list[str], variables: set[str]) -> list[str]:
    """The hypothesis's overrides grouped by the variable each one sets."""
    by_variable = [o for o in hypothesis if _key(o) in variables]
    return by_variable or list(hypothesis)


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def _diff(a: Any, b: Any, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Changed leaves between two config trees (lists compare as one leaf)."""
    if isinstance(a, dict) and isinstance(b, dict):
        found: dict[str, tuple[Any, Any]] = {}
        for key in sorted(set(a) | set(b), key=str):
            found.update(_diff(a.get(key), b.get(key), f"{prefix}{key}."))
        return found
    return {} if a == b else {prefix[:-1]: (a, b)}
