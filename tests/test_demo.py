"""The README's main job, end to end: `hyprun demo` on the CPU against a local MLflow file."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from runner.cli.demo import run_demo
from runner.store.investigation import Store

pytestmark = pytest.mark.slow  # the whole demo: two investigations, minutes on 2 cores


def test_demo_fixes_one_fault_and_escalates_the_other(workdir):
    store = Store(f"sqlite:///{workdir}/mlflow.db", "hyprun-demo")
    names = run_demo(store)

    fixed = store.find_any(names["fixed"])
    assert [t.verdict for t in fixed.tests][-1] == "confirmed" and fixed.strikes < 3
    confirmed = fixed.confirmed[0]
    assert confirmed.variable == "optim.lr" and confirmed.tags["hyprun.verified"] != "none"

    escalated = store.find_any(names["escalated"])
    assert escalated.escalated and escalated.strikes == 3
    assert [t.verdict for t in escalated.tests] == ["rejected"] * 3  # the fourth never ran
    client = MlflowClient(tracking_uri=store.uri)
    artifacts = [a.path for a in client.list_artifacts(escalated.run_id)]
    assert "escalation.md" in artifacts and "diagnosis.json" in artifacts
