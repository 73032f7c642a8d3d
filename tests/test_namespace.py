"""hyprun imports as `hyprun.*`: a user's project with its own `conf/`, `runner.py`, `diag/` and
`hypotheses/` beside its train.py runs through hyprun from its own folder, and none of those is
imported in place of ours. The package list in pyproject.toml covers every package folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

from tests.helpers import python_env

ROOT = Path(__file__).parents[1]
TOY = ROOT / "tests" / "apps" / "toy"
SHADOWS = ("runner.py", "diag/__init__.py", "hypotheses/__init__.py")


def user_project(folder: Path) -> Path:
    """The toy app as a user keeps it: train.py and conf/ at the top of their project, next to
    modules whose names hyprun's folders share; each refuses to be imported."""
    shutil.copy(TOY / "train.py", folder / "train.py")
    shutil.copytree(TOY / "conf", folder / "conf")
    declared = (TOY / "hyprun.yaml").read_text().replace("tests.apps.toy.train:main", "train:main")
    (folder / "hyprun.yaml").write_text(declared)
    (folder / "conf" / "__init__.py").write_text("raise ImportError('user conf/ imported')\n")
    for name in SHADOWS:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(f"raise ImportError('user {name} imported')\n")
    return folder


def test_a_users_conf_runner_and_diag_never_shadow_ours(tmp_path: Path):
    project = user_project(tmp_path)
    env = python_env(MLFLOW_TRACKING_URI=f"sqlite:///{project}/mlflow.db")
    env.pop("PYTHONPATH")  # as a user runs it: hyprun installed, their folder first on the path
    command = [sys.executable, "-m", "hyprun.runner.cli.main"]
    baseline = ["baseline", "--app", "train:main", "--seeds", "2", "--investigation", "mine"]
    done = subprocess.run(
        [*command, *baseline], cwd=project, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "imported" not in done.stderr
    status = subprocess.run(
        [*command, "status"], cwd=project, env=env, capture_output=True, text=True, timeout=120
    )
    assert status.returncode == 0 and "mine" in status.stdout, status.stdout + status.stderr


def test_every_package_folder_is_installed_under_hyprun():
    """setuptools cannot rename what `find` returns, so the list is written out: a new package
    folder missing from it would be left out of the wheel."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        "hyprun." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in setuptools["package-dir"].values()
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == folders
