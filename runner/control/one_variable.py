"""The one-variable rule: what a hypothesis changes, measured on resolved configs.

A hypothesis is a list of Hydra overrides applied on top of the baseline's. Both are composed and
their trees diffed twice: unresolved (what was *set*) and resolved (what *follows*). A leaf that
changed only after resolution is derived by interpolation and rides along with its source. The
independent changes must form one variable: a single leaf, or a single config-group choice with
its own subtree (`sched=wsd` swaps the whole `sched` node).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from hypotheses.schema import relative_factor
from runner.compose import compose
from runner.errors import BadInput
from runner.launch.app import HydraApp

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

    def describe(self) -> str:
        if self.variable in self.changes:
            before, after = self.changes[self.variable]
            return f"{self.variable} {before}\u2192{after}"  # `optim.lr 1e-05→0.001`
        return f"{self.variable}: " + " ".join(self.overrides)


@lru_cache
def _rules() -> dict[str, Any]:
    return yaml.safe_load(CONTROLLED.read_text())


def config_groups() -> set[str]:
    """Names of the config groups (folders of conf/) a `group=choice` override can switch."""
    from importlib.resources import files

    root = files("conf")
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
    baseline_overrides: list[str], hypothesis: list[str], app: HydraApp | None = None
) -> Delta:
    """The Delta of `hypothesis` on top of the baseline, or BadInput when it is not exactly one
    uncontrolled variable (the message names every changed key and suggests the split).
    `app`: a user's Hydra app, whose own tree and declared controlled keys are used instead."""
    compose_tree = app.compose if app else compose
    rules = app.rules() if app else _rules()
    base_cfg = compose_tree(baseline_overrides)
    base = OmegaConf.to_container(base_cfg, resolve=True)
    hypothesis = resolve_relative(base, hypothesis)
    test_cfg = compose_tree([*baseline_overrides, *hypothesis])
    resolved = _diff(base, OmegaConf.to_container(test_cfg, resolve=True))
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
    variables = _variables(independent, hypothesis, app.groups() if app else config_groups())
    if len(variables) != 1:
        raise BadInput(
            f"the delta changes {len(variables)} variables ({', '.join(sorted(variables))}): "
            "test one at a time, e.g. "
            + " then ".join(f"'hyprun test {v}'" for v in _split(hypothesis, variables))
        )
    derived = tuple(sorted(k for k in changes if k not in independent))
    return Delta(tuple(hypothesis), variables.pop(), changes, derived)


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
