"""Where to look next: the lines every command that touches an investigation ends with.

Kept apart from report.py so `hyprun status` does not import matplotlib."""

from __future__ import annotations

from runner.store.investigation import State, Store, links


def where_to_look(store: Store, state: State) -> list[str]:
    """The MLflow UI command and its two deep links, then the CLI commands that find it."""
    found = links(store, state)
    lines = [f"MLflow UI: {found.serve}" if found.serve else f"MLflow UI: {store.uri}"]
    lines += [f"  its runs:  {found.runs}", f"  compared:  {found.compare}"]
    where = f"--investigation {state.name} --experiment {store.experiment}"
    lines += [f"hyprun status {where}", f"hyprun report {where}"]
    return lines
