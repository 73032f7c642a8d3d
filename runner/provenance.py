"""What produced a run: code version, package versions, hardware. Logged as MLflow tags."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


PACKAGES = ("torch", "deepspeed", "mlflow", "hydra-core", "optuna")
SOURCE_ROOT = Path(__file__).resolve().parent.parent


def git_state(root: Path = SOURCE_ROOT) -> tuple[str, bool]:
    """(commit SHA, dirty?) of the checkout hyprun runs from; ("unknown", False) when installed."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return "unknown", False
    return sha, dirty


SOURCE_SUFFIXES = (".py", ".yaml", ".yml")
"""What a Hydra app's behaviour is written in: its code and its configs."""
NOT_SOURCE = {"__pycache__", "node_modules", "outputs", "multirun", "mlruns", "lightning_logs"}
"""Folders of what runs leave (Hydra's outputs, MLflow's and Lightning's logs), not code."""
MAX_SOURCE_FILES = 5000
MANIFEST_CHARS = 3000
"""A manifest longer than this keeps only its digest (it travels in an MLflow tag)."""


def source_files(roots: list[Path]) -> dict[str, Path]:
    """The code and config files under `roots`, by path relative to the first root; hidden
    folders, virtual environments and run outputs skipped."""
    found: dict[str, Path] = {}
    for root in roots:
        for folder, subfolders, files in os.walk(root):
            here = Path(folder)
            subfolders[:] = sorted(
                name
                for name in subfolders
                if not name.startswith(".")
                and name not in NOT_SOURCE
                and not (here / name / "pyvenv.cfg").exists()
            )
            for name in sorted(files):
                if name.endswith(SOURCE_SUFFIXES) and len(found) < MAX_SOURCE_FILES:
                    found.setdefault(os.path.relpath(here / name, roots[0]), here / name)
    return found


def source_digest(roots: list[Path]) -> dict[str, object]:
    """{"hash": one digest of the files' names and contents, "files": {name: short digest}}:
    what an app's code was, so an edit outside git is seen too (`files` dropped when long)."""
    files = {
        name: hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        for name, path in source_files(roots).items()
    }
    whole = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    if len(json.dumps(files)) > MANIFEST_CHARS:
        files = {}
    return {"hash": whole, "files": files}


def source_changes(before: dict[str, object], now: dict[str, object]) -> str:
    """What changed between two digests, in words ("train.py edited, conf/x.yaml added")."""
    old, new = before.get("files") or {}, now.get("files") or {}
    if not old or not new:
        return "its files"
    changes = [f"{name} edited" for name in sorted(old) if name in new and old[name] != new[name]]
    changes += [f"{name} added" for name in sorted(set(new) - set(old))]
    changes += [f"{name} removed" for name in sorted(set(old) - set(new))]
    shown = ", ".join(changes[:5])
    return shown + (f" and {len(changes) - 5} more" if len(changes) > 5 else "")


def tags(world: int, device: torch.device) -> dict[str, str]:
    import torch  # only a job calls this: commands that do not train never import torch

    sha, dirty = git_state()
    found = {
        "hyprun.git_sha": sha,
        "hyprun.git_dirty": str(dirty).lower(),
        "mlflow.source.git.commit": sha,
        "hyprun.world_size": str(world),
        "hyprun.device": device.type,
        "hyprun.device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "version.python": platform.python_version(),
    }
    for package in PACKAGES:
        try:
            found[f"version.{package}"] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[f"version.{package}"] = "absent"
    return found


def slurm_tags() -> dict[str, str]:
    """Which Slurm job (array task) runs this attempt, and how often it was requeued; empty
    outside Slurm. Set on every attempt, so a resumed run shows its latest."""
    env = os.environ
    if "SLURM_JOB_ID" not in env:
        return {}
    array = env.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{env['SLURM_ARRAY_TASK_ID']}" if array else env["SLURM_JOB_ID"]
    return {
        "slurm.job_id": job,
        "slurm.nodes": env.get("SLURM_JOB_NODELIST", ""),
        "slurm.restarts": env.get("SLURM_RESTART_COUNT", "0"),
    }
