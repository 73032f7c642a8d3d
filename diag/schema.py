"""The project's vocabulary and how its YAML files are read.

Every rule table, card and parameter file is data that users edit, so each is validated by a
pydantic model before anything uses it: an unknown key, a wrong type or a missing field is one
line naming the file, the entry and the field (`hyprun` prints it and exits 2), never a KeyError
in the middle of a check. The words the method uses everywhere (its three core questions, the
groups a report sorts findings into) are defined once, here.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

QUESTIONS = {
    "Q1": "why isn't it converging?",
    "Q2": "what are these early anomaly signals?",
    "Q3": "why isn't it fast enough?",
}
"""The method's three core questions: every finding, check and card answers one."""
Question = Literal["Q1", "Q2", "Q3"]

GROUPS = ("architecture", "training dynamics", "data pipeline", "scaling/distribution")
"""The groups a diagnostic report sorts its findings into."""
Group = Literal["architecture", "training dynamics", "data pipeline", "scaling/distribution"]


class Strict(BaseModel):
    """A YAML entry: unknown keys are refused (a typo is an error, not a silently unused key),
    values are immutable, and the docstring under each field documents it."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


Model = TypeVar("Model", bound=BaseModel)


def validated(model: type[Model], data: Any, where: str = "") -> Model:
    """`data` as a `model`, or a one-line ValueError: `WHERE: FIELD: PROBLEM; FIX`."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        problem = first_error(err)
        raise ValueError(f"{where}: {problem}" if where else problem) from None


def first_error(err: ValidationError) -> str:
    """The first problem pydantic found, in words, with the fix after a `;`."""
    problems = err.errors()
    # A misspelt key shows up twice, as unknown and as missing: the spelling is the better clue.
    problem = next((e for e in problems if e["type"] == "extra_forbidden"), problems[0])
    *parents, last = [str(part) for part in problem["loc"]] or ["(top level)"]
    inside = f" in {'.'.join(parents)}" if parents else ""
    if problem["type"] == "extra_forbidden":
        return f"unknown key {last!r}{inside}; remove it or fix its spelling"
    if problem["type"] == "missing":
        return f"missing field {last!r}{inside}; add `{last}:`"
    if problem["type"] == "value_error":  # our own validators' words, as they wrote them
        where = ".".join(str(part) for part in problem["loc"])
        return f"{where + ': ' if where else ''}{problem['ctx']['error']}"
    got = problem.get("input")
    shown = "" if isinstance(got, dict | list) or got is None else f", got {got!r}"
    if isinstance(got, str) and _reads_as_number(got):
        shown += " (YAML 1.1 reads 1e-2 as a string: write 1.0e-2)"
    where = ".".join(str(part) for part in problem["loc"])
    return f"{where + ': ' if where else ''}{problem['msg']}{shown}; fix the value"


def _reads_as_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@lru_cache(maxsize=64)
def _parse(path: str, mtime_ns: int, size: int) -> Any:
    """Parsed YAML, cached by path and modification stamp (an edited file is reread)."""
    try:
        return yaml.load(Path(path).read_text(), Loader=_Loader)
    except yaml.YAMLError as err:
        line = " ".join(str(err).split())
        raise ValueError(f"{path}: not valid YAML ({line}); fix the syntax") from None


def read_yaml(path: Path) -> Any:
    """A trusted YAML file of the project's (tables, parameters), parsed once per edit."""
    stat = Path(path).stat()
    return _parse(str(path), stat.st_mtime_ns, stat.st_size)


def load(model: type[Model], path: Path) -> Model:
    """A whole YAML file validated as `model`."""
    return validated(model, read_yaml(path), str(path))
