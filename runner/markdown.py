"""Markdown tables: the one renderer behind escalation.md, the report and the benchmarks."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def cell(value: Any) -> str:
    """A value as one table cell: a `|` would end the cell and a newline the row."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """GitHub-flavoured Markdown table lines; cells are escaped, so any text is safe."""
    lines = ["| " + " | ".join(map(cell, head)) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return lines
