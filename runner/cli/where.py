"""Where to look next: the lines every command that touches an investigation ends with.

Kept apart from report.py so `hyprun status` does not import matplotlib."""

from __future__ import annotations

from hyprun.runner.store.investigation import State, Store, links


def where_to_look(store: Store, state: State, commands: bool = True) -> list[str]:
    """The MLflow UI command and its two deep links (and, once escalated, the escalation
    report and how to reset), then (with `commands`) the CLI commands that find it."""
    found = links(store, state)
    lines = [f"MLflow UI: {found.serve or found.home}"]  # a server's without its credentials
    lines += [f"  its runs:  {found.runs}", f"  compared:  {found.compare}"]
    where = f"--investigation {state.name} --experiment {store.experiment}"
    if found.escalation:
        lines += [
            f"ESCALATED: {state.strikes} rejected hypotheses in a row; read {found.escalation}",
            f"  then a human decides: hyprun reset {where} --by NAME --reason TEXT",
        ]
    if commands:
        lines += [f"hyprun status {where}", f"hyprun report {where}"]
    return lines
