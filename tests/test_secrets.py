"""Secrets in the environment and credentials in URIs never reach MLflow or the job's output."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import python_env

pytestmark = pytest.mark.slow  # a job in a subprocess

SECRETS = {
    "MLFLOW_TRACKING_TOKEN": "tok-4f9a1c77",
    "MY_DB_PASSWORD": "hunter2-pw-91",
    "CLOUD_SECRET": "s3cr3t-xyz",
    "OPENAI_API_KEY": "sk-test-abcdef",
}


def test_secrets_are_redacted_everywhere(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    overrides = [
        "budget.tokens=2048",
        "budget.eval_every_tokens=1024",
        "budget.eval_sequences=16",
        "+notes.db=${oc.env:MY_DB_PASSWORD}",
        "+notes.bucket=https://ana:pa55word@store.example/x",
        "+tracking.tags.token=${oc.env:MLFLOW_TRACKING_TOKEN}",
        "tracking.run_name=job-${oc.env:CLOUD_SECRET}-${oc.env:OPENAI_API_KEY}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "hyprun.runner.job.train", *overrides],
        cwd=tmp_path,
        env=python_env(MLFLOW_TRACKING_URI=uri, **SECRETS),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("hyprun").experiment_id])
    config = _artifact(client, run, tmp_path)
    recorded = " ".join(
        [
            done.stdout,
            done.stderr,
            run.info.run_name,
            config,
            *run.data.params.values(),
            *run.data.tags.values(),
        ]
    )
    for secret in [*SECRETS.values(), "pa55word"]:
        assert secret not in recorded
    assert run.data.params["notes.db"] == "***"
    assert run.data.params["notes.bucket"] == "https://***@store.example/x"


def _artifact(client: MlflowClient, run, folder) -> str:
    path = client.download_artifacts(run.info.run_id, "config.yaml", str(folder))
    with open(path) as file:
        return file.read()
