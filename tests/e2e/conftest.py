"""Fixtures for tests against real services started outside pytest (CI: .ci/run)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.e2e import browser


@pytest.fixture(scope="session")
def slurm() -> None:
    """A running Slurm cluster (slurm/local/up.sh starts one). Without one the test is skipped,
    unless HYPRUN_REQUIRE_SLURM=1 (CI), where its absence is a failure."""
    required = os.environ.get("HYPRUN_REQUIRE_SLURM") == "1"
    problem = None
    if shutil.which("sinfo") is None:
        problem = "no sinfo on PATH: start a cluster with slurm/local/up.sh"
    else:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30
        )
        states = out.stdout.split()
        if out.returncode != 0 or not any(
            s.rstrip("*") in ("idle", "mixed", "allocated") for s in states
        ):
            problem = f"Slurm has no usable node ({out.stdout.strip() or out.stderr.strip()})"
    if problem and required:
        pytest.fail(problem)
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="session")
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
    driver.quit()
