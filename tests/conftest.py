"""Shared fixtures: isolated working folders and a real MLflow server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hyprun.runner.job import threads
from tests.helpers import free_port, start_mlflow_server


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker trains on its part of the CPU share: the workers' jobs,
    in-process and in subprocesses (which inherit it), run OMP_NUM_THREADS = share / workers
    unless the environment already sets it. Two workers of two threads each on 2 cores only
    fought (make test-fast took 20 min at load ~11 against 3 idle)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        share = threads.cpu_share().count
        os.environ["OMP_NUM_THREADS"] = str(max(1, share // workers))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that need a service started outside pytest carry its marker, so `make test-fast`
    (-m "not slow and not slurm and not browser") leaves them out; under pytest-xdist they
    share one worker (--dist loadgroup): one Slurm node and one Chromium are not to be shared."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, marker in (("slurm", "slurm"), ("chromium", "browser")):
            if fixture in fixtures:
                item.add_marker(getattr(pytest.mark, marker))
                item.add_marker(pytest.mark.xdist_group(marker))


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test runs in its own folder: checkpoints, Hydra outputs and mlflow.db land there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.fixture
def uri(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An MLflow store of the test's own (sqlite in its folder), no run active: where a probe
    attached in the test records."""
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/mlflow.db")
    return os.environ["MLFLOW_TRACKING_URI"]


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
def one_torch_thread(monkeypatch: pytest.MonkeyPatch):
    """One intra-op thread for in-process training of foreign apps: on a shared 2-core machine
    more threads only fight (a tiny HF Trainer run measured ~10x slower with two). Through
    OMP_NUM_THREADS too, which the app launcher's sizing honours (runner/job/threads.py)."""
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
