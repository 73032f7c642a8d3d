"""Fixtures for tests against real services started outside pytest (CI: .ci/run)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.e2e import browser
from tests.helpers import free_port, start_mlflow_server

# slurm/local/up_two_nodes.sh's cluster: two nodes in their own network namespaces, which reach
# this host (slurmctld, slurmdbd, an MLflow server) at the bridge's address.
TWO_NODES_CONF = "/etc/slurm-twonode/slurm.conf"
BRIDGE_ADDRESS = "10.77.0.1"


def _require(problem: str | None) -> None:
    """Skip on a missing service, unless HYPRUN_REQUIRE_SLURM=1 (CI): there it is a failure."""
    if problem and os.environ.get("HYPRUN_REQUIRE_SLURM") == "1":
        pytest.fail(problem)
    if problem:
        pytest.skip(problem)


def _slurm_problem(start: str, nodes: int = 1, **env: str) -> str | None:
    """Why Slurm (the cluster `env` names) has fewer than `nodes` usable nodes, or None."""
    if shutil.which("sinfo") is None:
        return f"no sinfo on PATH: start a cluster with {start}"
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%T"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
    )
    usable = [s for s in out.stdout.split() if s.rstrip("*") in ("idle", "mixed", "allocated")]
    if out.returncode != 0 or len(usable) < nodes:
        found = out.stdout.strip() or out.stderr.strip()
        return f"Slurm has fewer than {nodes} usable node(s) ({found}): start them with {start}"
    return None


@pytest.fixture(scope="session")
def slurm() -> None:
    """A running Slurm cluster (slurm/local/up.sh starts one). Without one the test is skipped,
    unless HYPRUN_REQUIRE_SLURM=1 (CI), where its absence is a failure."""
    _require(_slurm_problem("slurm/local/up.sh"))


@pytest.fixture(scope="session")
def two_node_cluster() -> str:
    """The SLURM_CONF of a running two-node cluster (slurm/local/up_two_nodes.sh); skipped or
    failed without one, as `slurm` is."""
    start = "slurm/local/up_two_nodes.sh"
    _require(_slurm_problem(start, nodes=2, SLURM_CONF=TWO_NODES_CONF))
    return TWO_NODES_CONF


@pytest.fixture(scope="session")
def bridge_mlflow_server(two_node_cluster: str, tmp_path_factory: pytest.TempPathFactory):
    """A real `mlflow server` on the bridge's address, which both nodes and this host reach."""
    folder = tmp_path_factory.mktemp("mlflow-bridge")
    port = free_port()
    server = start_mlflow_server(folder, port, host=BRIDGE_ADDRESS)
    yield f"http://{BRIDGE_ADDRESS}:{port}"
    server.terminate()
    server.wait(timeout=30)


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A headless Chromium driven by Selenium (tests/e2e/install_chromium.sh installs it), with a
    fresh profile. Without one the test is skipped, unless HYPRUN_REQUIRE_BROWSER=1 (CI), where
    its absence is a failure."""
    problem = browser.missing()
    if problem and os.environ.get("HYPRUN_REQUIRE_BROWSER") == "1":
        pytest.fail(problem)
    if problem:
        pytest.skip(problem)
    driver = browser.start(tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    # Per module, not per session: left open on the MLflow UI, its renderer kept polling and took
    # ~30% of a core for the rest of the suite.
    driver.quit()
