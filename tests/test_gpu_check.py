"""bench/gpu_check.sh --cpu: the prepared GPU check runs end to end at tiny sizes and prints its
one table (CI proves the script works; the GPU figures come from a GPU node)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT, python_env


@pytest.mark.slow  # seven short jobs, each in a fresh process: ~1-2 min on 2 cores
def test_gpu_check_runs_on_a_cpu_and_prints_its_table():
    done = subprocess.run(
        ["bash", "bench/gpu_check.sh", "--cpu"],
        cwd=ROOT,
        env=python_env(PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    table = done.stdout
    for check in (
        "MFU, tiny bf16",
        "job (probes off) / bare DeepSpeed loop",
        "probes default / off",
        "probes every step / off",
        "per-step NaN check / off",
        "fp16 with dynamic loss scaling",
        "planted NaN",
        "peak memory / hyprun.diag.memory estimate",
    ):
        assert check in table, table
    assert "no result" not in table and "FAIL" not in table, table
    [nan_row] = [line for line in table.splitlines() if line.startswith("planted NaN")]
    assert "caught step 3, module blocks.0.mlp.fc" in nan_row
    [fp16_row] = [line for line in table.splitlines() if line.startswith("fp16")]
    assert "refused" in fp16_row and "needs a GPU" in fp16_row


def test_gpu_check_refuses_an_unknown_argument():
    done = subprocess.run(
        ["bash", "bench/gpu_check.sh", "--gpus=2"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and "unknown argument" in done.stderr
