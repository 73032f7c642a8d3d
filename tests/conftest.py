"""Shared fixtures: isolated working folders and a real MLflow server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import free_port, start_mlflow_server


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
    server = start_mlflow_server(folder, port)
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.wait(timeout=30)


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for in-process training of foreign apps: on a shared 2-core machine
    more threads only fight (a tiny HF Trainer run measured ~10x slower with two)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
