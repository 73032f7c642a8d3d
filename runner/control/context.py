"""What the steps of an investigation share: how a test ended (`Outcome`), the console, the
default metric, the user's app and its code version, one seed's job, where jobs run and which
controller runs them.

Jobs run in this process, one after another (importing torch and DeepSpeed costs seconds per
process; a tiny job takes about as long), or on Slurm with `hydra/launcher=slurm_cpu|slurm_8xa100`
among the baseline's overrides: then all seeds run at once, and every test of the investigation
runs where its baseline ran (runner/launch/launchers.py).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from rich.console import Console

from hyprun.diag.metric import MetricSpec
from hyprun.runner import provenance
from hyprun.runner.compose import compose
from hyprun.runner.errors import BadInput
from hyprun.runner.job.checkpoint import config_hash
from hyprun.runner.job.validate import validate
from hyprun.runner.launch.app import HydraApp
from hyprun.runner.launch.launchers import InProcess, Slurm, launcher_for, safe_name
from hyprun.runner.store.investigation import State, Store

DEFAULT_PRIMARY = MetricSpec("eval/loss", "min", 0.01)
console = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass
class Outcome:
    """What one `test` decided, for the CLI and the demo."""

    exit_code: int
    test: str | None = None
    verdict: dict[str, Any] | None = None


def drift_key(overrides: list[str], app: HydraApp | None = None) -> str:
    """The config hash a baseline is recorded under (bookkeeping keys excluded)."""
    if app is not None:
        return app.drift_key(overrides)
    return config_hash(compose(overrides), exclude=("checkpoint", "tracking"))


def app_of(state: State) -> HydraApp | None:
    """The user's app an investigation's baseline ran, or None for our own job."""
    record = (state.baseline or {}).get("app")
    return HydraApp.from_record(record) if record else None


def code_version(app: HydraApp | None) -> str:
    """The git commit of the code under test: the app's checkout, or hyprun's."""
    return app.git_sha() if app is not None else provenance.git_state()[0]


def job_config(
    store: Store,
    overrides: list[str],
    seed: int,
    parent: str,
    name: str,
    tags: dict,
    app: HydraApp | None = None,
) -> DictConfig:
    """One seed's job, recording into the investigation's store below `parent`."""
    if app is not None:
        return app.job_config(store.uri, store.experiment, overrides, seed, parent, name, tags)
    cfg = compose([*overrides, f"budget.seed={seed}"])
    validate(cfg)
    cfg.tracking.uri, cfg.tracking.experiment = store.uri, store.experiment
    cfg.tracking.parent_run_id = parent
    cfg.tracking.run_name = name
    cfg.tracking.tags = {**tags, "hyprun.seed": str(seed)}
    return cfg


def slurm_names(investigation: str, what: str) -> tuple[Path, str]:
    """(submitit's folder, the job name) of an investigation's jobs."""
    return Path(".hyprun/slurm") / safe_name(investigation), f"hyprun-{investigation}-{what}"


HARDWARE_KEYS = ("nodes", "tasks_per_node", "gpus_per_node", "gres", "constraint")


def where_tests_run(state: State, given: list[str], what: str) -> InProcess | Slurm:
    """Tests run where the baseline ran: hardware is a controlled variable. Queue settings
    (partition, time limit, ...) may differ."""
    recorded = state.baseline.get("launcher", [])
    group = [o for o in given if o.startswith("hydra/launcher=")]
    resources = [o for o in given if o.split("=")[0].rsplit(".", 1)[-1] in HARDWARE_KEYS]
    if (group and group[0] not in recorded) or resources:
        where = " ".join(recorded) or "in this process"
        raise BadInput(
            f"the baseline ran {where}: a test on other hardware is not controlled; "
            "drop the launcher override or record a new baseline there"
        )
    return launcher_for([*recorded, *given], *slurm_names(state.name, what))


def controller_id() -> str:
    """Who runs a test: host and process, so a rerun can tell a crashed controller's test."""
    return f"{socket.gethostname()}:{os.getpid()}"


def process_gone(controller: str) -> bool:
    """Whether the controller `host:pid` is a process of this host that no longer runs."""
    host, _, pid = controller.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False
