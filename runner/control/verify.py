"""`hyprun verify`: phase 4 of the method. Triage runs again on a confirmed fix's evidence and is
compared, finding by finding, with the baseline's (diag/fixed.py computes, runner/control/fixed.py
words it); `--promote` makes the fixed config the investigation's new baseline."""

from __future__ import annotations

import json
from typing import Any

from hyprun.diag.fixed import finding_changes
from hyprun.diag.triage import load_tables
from hyprun.hypotheses.schema import load_cards
from hyprun.runner.control.context import app_of, console, drift_key
from hyprun.runner.control.fixed import fixed_lines
from hyprun.runner.errors import BadInput
from hyprun.runner.store.investigation import Store


def verify(store: Store, name: str | None, test_name: str | None, promote: bool = False) -> dict:
    """Phase 4: re-run the checks that fired on the baseline against the confirmed fix's
    evidence; optionally make the fixed config the investigation's new baseline."""
    from hyprun.runner.control.diagnose import diagnose

    state = store.find(name)
    confirmed = [t for t in state.confirmed if test_name in (None, f"H{t.number}")]
    if not confirmed:
        raise BadInput(
            f"no confirmed hypothesis {test_name or ''} in {state.name!r}: "
            "verify follows a confirmed test"
        )
    test = confirmed[-1]
    before = diagnose(store.uri, state.baseline["seed_runs"][0], store.experiment)[1]
    runs = sorted(store.seed_runs(test.evidence_run), key=lambda r: int(r.data.tags["hyprun.seed"]))
    after = diagnose(store.uri, runs[0].info.run_id, store.experiment)[1]
    rows = {row.id: row for row in load_tables()}
    found = finding_changes(by_reading(before), by_reading(after), rows)
    result = {
        "test": f"H{test.number}",
        "resolved": [c.id for c in found if c.status == "gone"],
        "still": [c.id for c in found if c.status != "gone"],
        "new": [c.id for c in found if c.status == "new"],
    }
    store.tag(test.run_id, {"hyprun.verified": ",".join(result["resolved"]) or "none"})
    lines = fixed_lines(test, found, load_cards(), promote)
    console.print("\n".join(lines), markup=False)
    if promote:
        overrides = [*state.baseline["overrides"], *test.fix]
        promoted = dict(
            state.baseline,
            overrides=overrides,
            config_hash=drift_key(overrides, app_of(state)),
            seed_runs=[r.info.run_id for r in runs],
            promoted_from=f"H{test.number}",
        )
        store.tag(state.run_id, {"hyprun.baseline": json.dumps(promoted)})
        result["promoted"] = True
    return result


def by_reading(document: dict[str, Any]) -> dict[str, Any]:
    """The diagnosis with each reading a finding of its own: a fix is verified row by row, so a
    reading merged into another row's finding (`also`) can be gone while its leader still fires."""
    findings = []
    for finding in document.get("findings", []):
        findings.append(finding)
        for also in finding.get("also", []):
            findings.append({**finding, "id": also["id"], "evidence": also["evidence"], "also": []})
    return {**document, "findings": findings}
