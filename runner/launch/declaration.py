"""hyprun.yaml, and what an app's `@hydra.main` says: the declarations hyprun needs about a user's
app before it can run it (runner/launch/app.py runs it).

    app: my_pkg.train:main
    controlled: {seed: seed, data_order: data.seed, budget: trainer.max_steps, heldout: data.n_val}
    metric: {name: val_loss, direction: min, step: steps}
    knobs: {preset: lightning, prefix: trainer, optim.lr: model.lr}     # optional
    preflight: my_pkg.train:check                                      # optional

A missing or malformed entry is one line naming the file, the entry and the fix (BadInput, exit 2).
The decorator's `config_path`/`config_name` are read from the app's source, not by importing it:
importing an app imports its whole training stack, seconds before any refusal could be said.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hyprun.runner.errors import BadInput
from hyprun.runner.launch.knobs import declared_problem

DECLARATION = "hyprun.yaml"
Keys = str | list[str]


class Controlled(BaseModel):
    """Keys of the app's config that a hypothesis may not change."""

    model_config = ConfigDict(extra="forbid")
    seed: str
    """hyprun sets it to 0, 1, ... for the baseline's seeds (and a test reuses them)."""
    data_order: Keys
    budget: Keys
    """The token or step budget: the runs compared must train equally long."""
    heldout: Keys


class Metric(BaseModel):
    """The metric a verdict compares, as the app logs it to MLflow."""

    model_config = ConfigDict(extra="forbid")
    name: str
    direction: Literal["min", "max"]
    step: Literal["tokens", "steps"]
    """What the metric's MLflow step counts: runs are compared at matched steps of this kind."""
    min_effect: float = Field(0.01, ge=0)
    """The smallest relative improvement that matters (when a test names no card)."""


class Declaration(BaseModel):
    """The schema of hyprun.yaml."""

    model_config = ConfigDict(extra="forbid")
    app: str | None = None
    """`package.module:function`, the `@hydra.main` function (or --app on the command line)."""
    config_path: str | None = None
    """The app's config folder, relative to this file (default: the decorator's)."""
    config_name: str | None = None
    run: Literal["in_process", "subprocess"] = "in_process"
    """Where a local seed runs (on Slurm every seed is its own job, the app its own process)."""
    controlled: Controlled
    metric: Metric
    ignored: list[str] = []
    """Bookkeeping keys (output folders, run names) that are not part of the experiment."""
    knobs: dict[str, str] = {}
    """The cards' knobs in the app's keys (`optim.lr: training.learning_rate`), and/or a
    library's preset under the node the app passes to it (`preset: hf, prefix: training`);
    runner/launch/knobs.yaml lists both. A card whose keys are all mapped applies to the app."""
    preflight: str | None = Field(None, pattern=r"^[\w.]+:\w+$")
    """`package.module:function` hyprun calls with a test's composed config before it takes a
    number (no training): an exception refuses the test with its message."""


HINTS = {
    "controlled": "declare controlled: with seed, data_order, budget and heldout (keys of your "
    "config)",
    "controlled.seed": "add controlled.seed: the key hyprun sets to 0, 1, ... (e.g. seed)",
    "controlled.data_order": "add controlled.data_order: the key that fixes the data order "
    "(e.g. data.seed)",
    "controlled.budget": "add controlled.budget: the key of the token or step budget "
    "(e.g. trainer.max_steps)",
    "controlled.heldout": "add controlled.heldout: the key(s) that fix the held-out set "
    "(e.g. data.val_size)",
    "metric": "declare metric: with name, direction (min|max) and step (tokens|steps)",
    "metric.name": "add metric.name: the MLflow metric a verdict compares (e.g. eval_loss)",
    "metric.direction": "add metric.direction: min or max",
    "metric.step": "add metric.step: tokens or steps, what the metric's MLflow step counts",
}


def load_declaration(path: Path) -> Declaration:
    """hyprun.yaml, validated; BadInput names the file, the entry and the fix in one line."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise BadInput(f"{path}: not YAML ({' '.join(str(error).split())})") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a mapping with controlled: and metric:")
    try:
        declared = Declaration.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        if first["type"] == "missing":
            raise BadInput(f"{path}: {where} is missing: {HINTS.get(where, 'add it')}") from None
        raise BadInput(f"{path}: {where}: {first['msg']}") from None
    problem = declared_problem(declared.knobs)
    if problem:
        raise BadInput(f"{path}: {problem}")
    return declared


@dataclass(frozen=True)
class Decorator:
    """What an `@hydra.main(...)` says, read from the app's source."""

    source: Path
    config_path: str | None
    config_name: str | None
    version_base: str | None


def find_source(module: str) -> Path:
    """The file of `module`, found without importing it (importing an app imports its stack)."""
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # as `python -m` would
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise BadInput(
            f"--app: no Python module {module!r} here: run hyprun from the folder your app "
            "imports from, or put it on PYTHONPATH"
        )
    return Path(spec.origin)


def read_decorator(target: str) -> Decorator:
    """The `@hydra.main` arguments of `module:function`, when they are literals."""
    module, _, function = target.partition(":")
    if not module or not function:
        raise BadInput(f"--app {target}: write package.module:function (the @hydra.main one)")
    source = find_source(module)
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and _names_hydra_main(decorator.func):
                    return _decorator_arguments(source, decorator)
            return Decorator(source, None, None, "1.3")
    raise BadInput(f"--app {target}: {source} defines no function {function!r}")


def _names_hydra_main(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "main") or (
        isinstance(func, ast.Name) and func.id == "main"
    )


def _decorator_arguments(source: Path, call: ast.Call) -> Decorator:
    values: dict[str, Any] = {"version_base": None}
    names = ("config_path", "config_name", "version_base")
    for name, arg in zip(names, call.args, strict=False):
        values[name] = _literal(arg)
    for keyword in call.keywords:
        if keyword.arg in names:
            values[keyword.arg] = _literal(keyword.value)
    return Decorator(
        source, values.get("config_path"), values.get("config_name"), values["version_base"]
    )


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None  # computed: hyprun.yaml has to say it


def find_declaration(app_folder: Path | None) -> Path | None:
    """hyprun.yaml in the working folder, else next to the app's source."""
    for folder in (Path.cwd(), app_folder):
        if folder is not None and (folder / DECLARATION).is_file():
            return folder / DECLARATION
    return None
