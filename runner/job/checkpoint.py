"""Checkpoints of one job: periodic and on SIGTERM/SIGUSR1, resumed by rerunning the same job.

A job is identified by the hash of its resolved config (plus world size), so rerunning the same
command finds its folder, its last DeepSpeed checkpoint and the MLflow run it was writing to.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import signal
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hyprun.runner.errors import BadInput

RUN_FILE = "run.json"


def config_hash(cfg: DictConfig, exclude: tuple[str, ...] = ("checkpoint",)) -> str:
    """A stable hash of the resolved config without the `exclude` top-level keys."""
    tree = OmegaConf.to_container(cfg, resolve=True)
    for key in exclude:
        tree.pop(key, None)
    return hashlib.sha256(json.dumps(tree, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Checkpointer:
    """The checkpoint folder of one job: `run.json` (its MLflow run) and DeepSpeed tags."""

    def __init__(self, root: str | Path, job_key: str, is_main: bool):
        self.dir = Path(root) / job_key
        self.is_main = is_main

    def run_id(self) -> str | None:
        """The MLflow run of an unfinished earlier attempt of this job, if any."""
        path = self.dir / RUN_FILE
        if not path.exists():
            return None
        try:
            return str(json.loads(path.read_text())["run_id"])
        except (ValueError, KeyError, TypeError):
            raise self.corrupt(f"{RUN_FILE} is not valid") from None

    def corrupt(self, what: str) -> BadInput:
        return BadInput(
            f"the checkpoint in {self.dir} cannot be resumed ({what}): delete that "
            "folder to start over, or rerun with checkpoint.resume=never"
        )

    def remember_run(self, run_id: str) -> None:
        if self.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / (RUN_FILE + ".tmp")
            tmp.write_text(json.dumps({"run_id": run_id}))
            tmp.replace(self.dir / RUN_FILE)

    def save(self, engine, step: int) -> None:
        """Save after `step` optimizer steps; older tags go once the new one is complete."""
        tag = f"step{step:09d}"
        engine.save_checkpoint(str(self.dir), tag=tag, client_state={"step": step, "rng": _rng()})
        if self.is_main:
            for old in self.dir.glob("step*"):
                if old.name != tag:
                    shutil.rmtree(old, ignore_errors=True)

    def load(self, engine) -> int:
        """Restore the latest checkpoint into `engine`; return the steps already done (0: none)."""
        if not (self.dir / "latest").exists():
            return 0
        try:
            path, state = engine.load_checkpoint(str(self.dir))
            if path is None:
                return 0
            _set_rng(state["rng"])
            return int(state["step"])
        except Exception as error:  # truncated files, a tag that names nothing, foreign state
            detail = " ".join(str(error).split())[:200]
            raise self.corrupt(f"{type(error).__name__}: {detail}") from None

    def finish(self) -> None:
        """The job completed: its checkpoints are no longer needed, and a rerun starts afresh."""
        if self.is_main:
            shutil.rmtree(self.dir, ignore_errors=True)


class StopSignals:
    """Turns SIGTERM/SIGUSR1/SIGUSR2 (Slurm preemption, time-limit warning, scancel) into a flag
    the loop polls, so the job stops at a step boundary with a checkpoint instead of dying
    mid-step. (USR2 is the warning submitit asks Slurm for.)"""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        try:
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: whoever owns the thread handles signals
            pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame) -> None:
        self.received = signum


# numpy and torch are imported where the RNG state is read: config_hash() serves the controller,
# which must not wait on torch's import (runner/job/__init__.py).


def _rng() -> dict[str, Any]:
    import numpy as np
    import torch

    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
