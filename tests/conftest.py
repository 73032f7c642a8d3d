"""Shared fixtures: isolated working folders and a real MLflow server."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import free_port, python_env


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test runs in its own folder: checkpoints, Hydra outputs and mlflow.db land there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """A real `mlflow server` on 127.0.0.1 for the session; yields its URI."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    env = python_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    log = open(folder / "server.log", "w")  # noqa: SIM115 (open for the server's lifetime)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{folder}/server.db",
            "--artifacts-destination",
            str(folder / "artifacts"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=folder,
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if server.poll() is not None:
                output = (folder / "server.log").read_text()
                raise RuntimeError(f"mlflow server exited: {output}") from None
            time.sleep(0.5)
    else:
        server.kill()
        raise RuntimeError("mlflow server did not start within 120 s")
    yield uri
    server.terminate()
    server.wait(timeout=30)
    log.close()
