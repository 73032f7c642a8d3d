"""What produced a run: code version, package versions, hardware. Logged as MLflow tags."""

from __future__ import annotations

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
