"""`hyprun baseline` ends with the question and its top findings; `hyprun diagnose` with no
--run reads the investigation's baseline, not whatever job ran last."""

from __future__ import annotations

import json

import pytest

from hyprun.runner.cli.main import main as hyprun
from hyprun.runner.job.train import run
from hyprun.runner.store.investigation import Store
from tests.helpers import job_config

pytestmark = pytest.mark.slow  # a baseline of seed jobs

SHORT = ["budget.tokens=8192", "budget.eval_every_tokens=4096", "probes.every_steps=4"]


def cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_:
        hyprun(list(args))
    return exit_.value.code


def test_baseline_prints_findings_and_diagnose_defaults_to_it(workdir, capsys, monkeypatch):
    uri = f"sqlite:///{workdir}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    overrides = [*SHORT, "optim.lr=1e-7", f"checkpoint.dir={workdir}/ckpt"]
    assert cli("baseline", *overrides, "--seeds", "1", "--investigation", "flat") == 0
    printed = capsys.readouterr().out
    assert "core question: Q1" in printed and "1. lr_too_low" in printed, printed
    baseline_seed0 = Store(uri, "hyprun").find("flat").baseline["seed_runs"][0]

    later = run(job_config(workdir, "budget.tokens=4096", uri=uri))  # a newer, unrelated run
    assert later.run_id != baseline_seed0
    capsys.readouterr()
    assert cli("diagnose", "--uri", uri, "--experiment", "hyprun", "--json") == 0
    document = json.loads(capsys.readouterr().out)
    assert document["run_id"] == baseline_seed0
    assert document["findings"][0]["id"] == "lr_too_low"
