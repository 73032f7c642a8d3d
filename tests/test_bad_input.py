"""Bad input: one line naming the problem and the fix, exit code 2, nothing recorded or trained."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runner.cli import main as hyprun
from tests.helpers import ROOT, python_env

CASES = {
    "unknown key": (["optim.lrr=1e-3"], "unknown config key 'optim.lrr'"),
    "unknown group option": (["model=gpt_huge"], "no config 'model/gpt_huge': choose one of"),
    "unparsable override": (["optim.lr=[1,"], "cannot parse an override"),
    "negative budget": (["budget.tokens=-5"], "budget.tokens=-5 must be a positive whole number"),
    "zero budget": (["budget.tokens=0"], "budget.tokens=0 must be a positive whole number"),
    "nan budget": (["budget.tokens=nan"], "budget.tokens=nan must be a positive whole number"),
    "string budget": (["budget.tokens=lots"], "budget.tokens='lots' must be a positive whole"),
    "fp16 on a CPU": (["ds.precision=fp16"], "ds.precision=fp16 needs a GPU"),
    "unknown precision": (["ds.precision=fp8"], "ds.precision=fp8 is unknown"),
    "bad ZeRO stage": (["ds.zero_stage=4"], "ds.zero_stage=4 is not a ZeRO stage"),
    "zero learning rate": (["optim.lr=0"], "optim.lr=0 must be a finite number > 0.0"),
    "missing data path": (["data=token_file"], "data.source.path is required"),
    "missing data file": (["data=token_file", "data.source.path=/no/such.bin"], "not found"),
    "budget below one step": (["budget.tokens=100"], "less than one optimizer step"),
    "bad model switch": (["model.norm=batchnorm"], "model:"),
    "bad synthetic knob": (["data.source.duplicate_frac=1.5"], "duplicate_frac"),
}


@pytest.mark.parametrize(("overrides", "expected"), CASES.values(), ids=CASES.keys())
def test_hyprun_train_refuses(workdir, capsys, overrides, expected):
    with pytest.raises(SystemExit) as exit_:
        hyprun(["train", f"checkpoint.dir={workdir}/ckpt", *overrides])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err, err
    assert not (workdir / "mlflow.db").exists() and not (workdir / "ckpt").exists()


@pytest.mark.parametrize("case", ["unknown key", "missing data file", "fp16 on a CPU"])
def test_python_m_runner_train_refuses(tmp_path: Path, case: str):
    overrides, expected = CASES[case]
    done = subprocess.run(
        [sys.executable, "-m", "runner.train", *overrides],
        cwd=tmp_path, env=python_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("hyprun:")]
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir()), "a refused job must write nothing"


def test_installed_wheel_finds_conf(tmp_path: Path):
    """conf/ ships in the wheel: an installed hyprun composes configs away from any checkout."""
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheel_dir), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = wheel_dir.glob("hyprun-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    probe = (
        "import runner, conf; from runner.compose import compose; "
        "print(runner.__file__); print(compose(['model=gpt_1b']).model.n_layer)"
    )
    env = python_env(PYTHONPATH=str(target))
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    location, layers = done.stdout.split()
    assert location.startswith(str(target)) and layers == "18"
