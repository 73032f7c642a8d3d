"""Three strikes in a row: the investigation stops and a human gets the evidence and the questions
(escalation.md, a notice); their recorded decision (`reset`) lets testing go on."""

from __future__ import annotations

import json
import time
import uuid

from rich.markup import escape

from hyprun.runner import markdown
from hyprun.runner.compose import compose
from hyprun.runner.control.context import app_of, console, controller_id
from hyprun.runner.control.notify import notify
from hyprun.runner.control.standing import settle
from hyprun.runner.errors import BadInput
from hyprun.runner.store.investigation import State, Store


def escalate(store: Store, state: State) -> None:
    """Three strikes: stop, and hand a human the evidence and the fundamental questions.

    Tests finishing together may all see the last strike: the first to claim the escalation
    writes the report and sends the notice, once."""
    console.print(
        f"[bold red]Escalated[/]: {state.strikes} strikes. Report: escalation.md on run "
        f"{state.run_id}; then a human decides: hyprun reset --investigation "
        f"{escape(state.name)} --by NAME --reason TEXT"
    )
    for f in state.untested:
        console.print(
            f"  triage pointed at [bold]{f['id']}[/] and no test touched it: {f['first_action']}"
        )
    me = f"{controller_id()}:{uuid.uuid4().hex[:8]}"  # threads of one process differ too
    if not store.once(state.run_id, f"escalation.{len(state.resets) + 1}", me):
        return
    lines = [
        f"# Escalation: investigation {state.name}",
        "",
        f"{state.strikes} hypotheses in a row were rejected. hyprun refuses further tests "
        "until a human decides "
        f"(`hyprun reset --investigation {state.name} --by NAME --reason ...`).",
        "",
        f"Baseline: `{' '.join(state.baseline['overrides']) or 'defaults'}`, "
        f"{state.baseline['seeds']} seeds, git {state.baseline['git_sha'][:10]}.",
        "",
    ]
    lines += markdown.table(
        ["test", "delta", "verdict", "effect", "measured", "claimed"],
        [
            [
                f"H{t.number}",
                f"`{' '.join(t.delta)}`" + (" (compound)" if t.compound else ""),
                t.verdict,
                t.tags.get("hyprun.effect", ""),
                t.tags.get("hyprun.reason", ""),
                t.tags.get("hyprun.claimed", ""),
            ]
            for t in state.tests
        ],
    )
    promoted = state.baseline.get("promoted_from")
    fixes = [f"H{t.number}" for t in state.confirmed if f"H{t.number}" != promoted]
    if fixes:
        lines += [
            "",
            f"Confirmed before this run of failures: {', '.join(fixes)}. Make one the baseline "
            f"with `hyprun verify {fixes[-1]} --promote` after the reset, or decide why not.",
        ]
    lines += ["", *escalation_findings(state)]
    lines += [
        "",
        "## Questions for a human",
        "- Is the architecture appropriate for this task?",
        "- Is the data sufficient in quality and quantity?",
        "- Is the training recipe (LR, batch size, optimizer) reasonable?",
        "- Is this a known-working setup being reproduced, or something new?",
    ]
    report = "\n".join(lines) + "\n"
    store.text(state.run_id, report, "escalation.md")  # recorded before anyone is told
    store.tag(state.run_id, {"hyprun.escalated": "true"})
    # An app's config has no tracking node of ours: hyprun's own defaults say whom to notify.
    tracking = compose([] if app_of(state) else state.baseline["overrides"]).tracking
    if tracking.notify_url or tracking.notify_command:
        notice = {
            "investigation": state.name,
            "run_id": state.run_id,
            "strikes": state.strikes,
            "tests": [f"H{t.number} {' '.join(t.delta)}: {t.verdict}" for t in state.tests],
            "untested_findings": [f["id"] for f in state.untested],
            "report": "escalation.md",
        }
        sent = notify(notice, tracking.notify_url, tracking.notify_command)
        store.tag(state.run_id, {"hyprun.notified": "; ".join(sent)})


def escalation_findings(state: State) -> list[str]:
    """escalation.md's section on the evidence: triage's top findings, the untouched first."""
    if not state.findings:
        return ["## What triage found", "", "No pattern fired on the baseline."]
    untested = {f["id"] for f in state.untested}
    lines = ["## What triage found, and what no test touched", ""]
    if untested:
        lines += [
            f"The evidence pointed at {', '.join(sorted(untested))}, and no test has touched "
            "it yet: start there, before another recipe tweak.",
            "",
        ]
    for rank, f in enumerate(state.findings, 1):
        tested = "**not tested yet**" if f["id"] in untested else "tested"
        cards = ", ".join(f["cards"]) or "no card"
        lines.append(
            f"{rank}. **{f['id']}** ({tested}; {cards}): {f['cause']}. "
            f"First action: {f['first_action']}"
        )
    return lines


def escalated_note(state: State) -> str:
    """What a user who hit the last strike needs in one line: which investigation, which tests
    struck, where the escalation report is, and the two ways on."""
    struck = ", ".join(f"H{t.number}" for t in state.counted if t.strike)
    return (
        f"investigation {state.name!r} is escalated: {state.strikes} rejected hypotheses in a "
        f"row ({struck}). Read its escalation report, escalation.md on MLflow run "
        f"{state.run_id} (hyprun status --investigation {state.name} prints where); then a "
        f"human decides: 'hyprun reset --investigation {state.name} --by NAME --reason TEXT' "
        "to go on testing, or a new investigation with 'hyprun baseline'"
    )


def reset(store: Store, name: str | None, by: str, reason: str) -> State:
    """A human's decision after an escalation: recorded on the parent run, strikes start over."""
    if not by.strip() or not reason.strip():
        raise BadInput("reset needs --by NAME and --reason TEXT: the decision is recorded")
    state = store.find(name)
    now = int(time.time() * 1000)
    record = {"by": by, "reason": reason, "time": now, "strikes_before": state.strikes}
    store.tag(
        state.run_id, {f"hyprun.reset.{now}": json.dumps(record), "hyprun.escalated": "false"}
    )
    return settle(store, state)  # its run's name and description no longer say escalated
