"""The README's main job, end to end: `hyprun demo` on the CPU against a local MLflow file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hyprun.runner.cli.demo import run_demo
from hyprun.runner.cli.main import main as hyprun
from hyprun.runner.store.investigation import Store

pytestmark = pytest.mark.slow  # the whole demo: two investigations, minutes on 2 cores


def test_demo_fixes_one_fault_and_escalates_the_other(workdir, capsys, monkeypatch):
    store = Store(f"sqlite:///{workdir}/mlflow.db", "hyprun-demo")
    names = run_demo(store)
    captured = capsys.readouterr()
    printed = captured.out

    fixed = store.find(names["fixed"])
    assert [t.verdict for t in fixed.tests][-1] == "confirmed" and fixed.strikes < 3
    confirmed = fixed.confirmed[0]
    assert confirmed.variable == "optim.lr" and confirmed.tags["hyprun.verified"] != "none"
    # verify says which finding the fix removed and why another still fires, with numbers
    number = confirmed.number
    gone = f"gone: loss_flat, which H{number} was tested for: loss_rel_drop "
    assert gone in captured.err, captured.err
    for survivor in re.findall(r"still firing: (\w+), which", captured.err):
        assert f"'hyprun verify H{number} --promote', then 'hyprun test" in captured.err, survivor

    escalated = store.find(names["escalated"])
    assert escalated.escalated and escalated.strikes == 3
    assert [t.verdict for t in escalated.tests] == ["rejected"] * 3  # the fourth never ran
    client = MlflowClient(tracking_uri=store.uri)
    artifacts = [a.path for a in client.list_artifacts(escalated.run_id)]
    assert "escalation.md" in artifacts and "diagnosis.json" in artifacts

    # Every output points back to the evidence: the escalation names the finding no test touched.
    first = escalated.findings[0]  # label noise: one finding, led by either of its two rows
    assert first["id"] in {"noisy_labels", "noisy_labels_flat"}
    assert [f["id"] for f in escalated.untested][:1] == [first["id"]]
    report = client.download_artifacts(escalated.run_id, "escalation.md", str(workdir))
    text = Path(report).read_text()
    assert f"The evidence pointed at {first['id']}" in text and "**not tested yet**" in text
    assert f"not tested yet: {first['id']}" in printed
    # The parent runs follow their investigations, and are named with their outcome.
    for state, outcome in ((fixed, " · fixed by H"), (escalated, " · escalated after 3")):
        parent = client.get_run(state.run_id)
        assert outcome in parent.info.run_name, parent.info.run_name
        last = max(client.get_run(t.run_id).info.end_time for t in state.tests)
        assert parent.info.status == "FINISHED" and parent.info.end_time >= last
    # The commands the demo prints find its investigations, from the config's experiment too.
    for name in names.values():
        assert f"hyprun status --investigation {name} --experiment hyprun-demo" in printed
    assert "workflowType=machine_learning" in printed
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.uri)
    with pytest.raises(SystemExit) as status:
        hyprun(["status", "--investigation", names["escalated"]])
    assert status.value.code == 0
