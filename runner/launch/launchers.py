"""Where the controller's jobs run: in this process, or on Slurm through submitit.

The launcher is chosen the way Hydra chooses one: `hydra/launcher=slurm_8xa100` among the
overrides, plus any `hydra.launcher.KEY=VALUE`, composed from `conf/hydra/launcher/` (configs built
on hydra-submitit-launcher, so `python -m hyprun.runner.job.train -m ...` uses the same ones).
Without a
launcher override the jobs run here, one after another.

Either way each job records into MLflow, and results are read back from there: a Slurm job is
found by its parent run and seed, its held-out losses feed early rejection while it runs, and a
job the cluster cancelled or failed is a `Failed`, which the controller records as an error, not
evidence.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hyprun.runner import provenance
from hyprun.runner.errors import BadInput
from hyprun.runner.job.result import JobResult
from hyprun.runner.launch.app import AppFailed, AppJob, is_app, run_app
from hyprun.runner.store import app_runs
from hyprun.runner.store.tracking import RunReader

GROUP, KEYS = "hydra/launcher=", "hydra.launcher."
# Refused in launcher values (setup lines are shell by design): no partition, account, QoS or
# node list needs them, and a value is never meant to reach a shell.
SHELL_METACHARACTERS = set("$`;|&<>()\\\"'")
# sacct states of a job that is over without having completed (Slurm 22.05 names).
FAILED = {"BOOT_FAIL", "CANCELLED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT"}
# A requeued or preempted job comes back as PENDING with the same id.
WAITING = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESIZING",
    "SUSPENDED",
    "COMPLETING",
    "CONFIGURING",
    "PREEMPTED",
    "STAGE_OUT",
    "SIGNALING",
    "UNKNOWN",
}


@dataclass
class Job:
    """One seed of a baseline, a test or a sweep trial."""

    config: DictConfig
    """Its `tracking.parent_run_id` and `tracking.tags['hyprun.seed']` find its MLflow run."""
    on_eval: Callable[[int, float], bool] | None = None
    """Called with (tokens, held-out loss) as the job reports them; True stops its group."""
    group: str = ""
    """Jobs of one group (one test, one trial) stop together and fail together."""

    @property
    def seed(self) -> int:
        return int(self.config.tracking.tags["hyprun.seed"])


@dataclass
class Failed:
    """A job the cluster or the code ended without a result: infrastructure, not evidence."""

    reason: str


Outcome = JobResult | Failed | None
"""None: a job not run or stopped before it wrote anything (its group was stopped)."""


def split(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the job's overrides, the launcher's overrides)."""
    launcher = [o for o in overrides if o.startswith((GROUP, KEYS))]
    return [o for o in overrides if o not in launcher], launcher


def launcher_for(overrides: Sequence[str], folder: Path, name: str) -> InProcess | Slurm:
    """The launcher the overrides choose (default: this process)."""
    if not any(o.startswith(GROUP) for o in overrides):
        if overrides:
            raise BadInput(
                f"{overrides[0]} needs a launcher: add hydra/launcher=slurm_cpu or "
                "hydra/launcher=slurm_8xa100"
            )
        return InProcess()
    return Slurm(launcher_params(overrides), folder, name)


def launcher_params(overrides: Sequence[str]) -> dict[str, Any]:
    """The composed `hydra.launcher` node for the overrides, resolved."""
    from hyprun.runner.compose import compose

    cfg = compose(list(overrides), return_hydra_config=True)
    node = cfg.hydra.launcher
    if not str(node.get("_target_", "")).endswith("SlurmLauncher"):
        raise BadInput(
            f"{overrides[0]}: the controller launches on Slurm only; choose "
            "hydra/launcher=slurm_cpu or slurm_8xa100"
        )
    params = OmegaConf.to_container(node, resolve=True)
    params.pop("_target_")
    for key, value in _strings(params):
        if any(c in value for c in "\n\r\0"):
            raise BadInput(
                f"hydra.launcher.{key} contains a line break: each value becomes one "
                "#SBATCH line; remove it"
            )
        if not key.startswith("setup.") and (bad := sorted(set(value) & SHELL_METACHARACTERS)):
            raise BadInput(
                f"hydra.launcher.{key}={value!r} contains {''.join(bad)!r}: Slurm "
                "names and values need none of them; remove them"
            )
    return params


def _strings(tree: Any, prefix: str = ""):
    """(dotted key, value) of every string in a launcher config."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _strings(value, f"{prefix}{key}.")
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from _strings(value, f"{prefix}{i}.")
    elif isinstance(tree, str):
        yield prefix[:-1], tree


def watched_metric(config: DictConfig) -> str:
    """The metric a job reports as it trains: an app's declared one, else our `eval/loss`."""
    return config.app.record.declaration.metric.name if is_app(config) else "eval/loss"


def budget_of(config: DictConfig) -> int:
    """A job's budget, in the steps its primary metric is logged at (tokens for our job)."""
    return int(config.app.budget) if is_app(config) else int(config.budget.tokens)


class InProcess:
    """Jobs in this process, one after another; a stopped group skips its remaining jobs."""

    name = "local"

    def run(
        self,
        jobs: Sequence[Job],
        submitted: Callable[[list[str]], None] | None = None,
    ) -> list[Outcome]:
        outcomes: list[Outcome] = []
        stopped: set[str] = set()
        for job in jobs:
            if job.group in stopped:
                outcomes.append(None)
                continue
            if is_app(job.config):  # a user's app: its failure is this job's, not the batch's
                try:
                    result = run_app(job.config, on_eval=job.on_eval)
                except AppFailed as error:
                    outcomes.append(Failed(str(error)))
                    stopped.add(job.group)  # its other seeds would fail alike
                    continue
            else:
                from hyprun.runner.job.train import run

                result = run(job.config, on_eval=job.on_eval)
            if result.status == "stopped":
                stopped.add(job.group)
            outcomes.append(result)
        return outcomes


class TrainJob:
    """What a Slurm task runs: one controlled job from its resolved config.

    Checkpointable for submitit: a time-limit signal that reaches submitit's own handler
    requeues the job, and the rerun resumes from the job's last checkpoint."""

    def __init__(self, config: dict[str, Any]):
        self.config = config

    def __call__(self) -> JobResult:
        import os

        from hyprun.runner.job import dist
        from hyprun.runner.job.train import run

        dist.forget_submitter()
        result = run(OmegaConf.create(self.config))
        # The warning before a time limit (USR1/USR2): the job checkpointed; queue it again.
        # SIGTERM needs nothing: scancel ends the job, `scontrol requeue` and preemption requeue.
        if result.stopped_by in ("SIGUSR1", "SIGUSR2") and os.environ.get("SLURM_PROCID") == "0":
            job = provenance.slurm_tags()["slurm.job_id"]
            subprocess.run(["scontrol", "requeue", job], check=True, timeout=60)
        return result

    def checkpoint(self, *args: Any, **kwargs: Any):
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def slurm_task(config: DictConfig) -> TrainJob | AppJob:
    """The picklable callable a Slurm task runs for one job."""
    plain = OmegaConf.to_container(config, resolve=True)
    return AppJob(plain) if is_app(config) else TrainJob(plain)


@dataclass
class _Running:
    job: Job
    submitted: Any
    """submitit's Job."""
    run_id: str | None = None
    seen: int = 0
    state: str = "PENDING"
    cancelled: bool = False
    outcome: Outcome = field(default=None)
    done: bool = False

    @property
    def slurm_id(self) -> str:
        return self.submitted.job_id


class Slurm:
    """Jobs as one Slurm job array through submitit; polled until every job is over."""

    name = "slurm"
    poll_s = 5.0

    def __init__(self, params: dict[str, Any], folder: Path, name: str):
        self.params = dict(params)
        self.folder = folder
        self.job_name = safe_name(name)

    def executor(self):
        import submitit
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

        params = dict(self.params)
        params.pop("submitit_folder", None)
        params["name"] = self.job_name
        init = {"slurm_max_num_timeout": params.pop("max_num_timeout", 0)}
        executor = submitit.AutoExecutor(folder=self.folder / "%j", cluster="slurm", **init)
        # As hydra-submitit-launcher does: its shared keys go as they are, the rest as slurm_KEY.
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(
            **{k if k in shared else f"slurm_{k}": v for k, v in params.items() if v is not None}
        )
        return executor

    def run(
        self,
        jobs: Sequence[Job],
        submitted: Callable[[list[str]], None] | None = None,
    ) -> list[Outcome]:

        executor = self.executor()
        with executor.batch():  # one job array
            handles = [executor.submit(slurm_task(j.config)) for j in jobs]
        running = [_Running(job, handle) for job, handle in zip(jobs, handles, strict=True)]
        if submitted:
            submitted([r.slurm_id for r in running])
        runs = RunReader(jobs[0].config.tracking.uri)
        while not all(r.done for r in running):
            time.sleep(self.poll_s)
            states = sacct_states([r.slurm_id for r in running])
            for r in running:
                if not r.done:
                    r.state = states.get(r.slurm_id, r.state)
                    self._advance(r, running, runs)
        return [r.outcome for r in running]

    def _advance(self, r: _Running, running: list[_Running], runs: RunReader) -> None:
        """Read a job's new held-out losses, and its outcome once Slurm says it is over."""
        if r.run_id is None:
            r.run_id = runs.seed_run(r.job.config.tracking.parent_run_id, r.job.seed)
        if r.run_id is not None and r.job.on_eval is not None and not r.cancelled:
            history = runs.history(r.run_id, watched_metric(r.job.config))
            for tokens, value in history[r.seen :]:
                if r.job.on_eval(tokens, value):
                    self._cancel([o for o in running if o.job.group == r.job.group])
                    break
            r.seen = len(history)
        if r.state == "COMPLETED" or (r.cancelled and r.state not in WAITING):
            r.done = True
            if r.run_id is None:
                r.outcome = None
            elif r.cancelled:
                r.outcome = result_of(self._stopped_run(r, runs))
            else:
                r.outcome = result_of(runs.run(r.run_id))
        elif r.state in FAILED:
            r.done = True
            r.outcome = Failed(f"Slurm job {r.slurm_id} {r.state}{_tail(r.submitted)}")
            self._cancel([o for o in running if o.job.group == r.job.group and not o.done])

    settle_s = 60.0
    """How long a cancelled job may take to record its end (Slurm's KillWait is 30 s)."""

    def _stopped_run(self, r: _Running, runs: RunReader):
        """The run of a job we cancelled, once the job has returned (its result file written: it
        recorded how it ended; Slurm calls the job over at the cancel, while it still winds
        down), marked `stopped` as a seed stopped in this process is. A job that completed
        before the cancel stays completed; one the cluster killed first is closed here, at the
        last step its metric reached."""
        deadline = time.monotonic() + self.settle_s
        returned = r.submitted.paths.result_pickle
        while not returned.exists() and time.monotonic() < deadline:
            time.sleep(1.0)
        run = runs.run(r.run_id)
        ended = returned.exists()
        if ended and run.data.tags.get("hyprun.outcome") in ("completed", "diverged"):
            return run
        tags = {"hyprun.outcome": "stopped"}
        if not ended:  # killed before it wrote how far it trained
            config = r.job.config
            unit = config.app.record.declaration.metric.step if is_app(config) else "tokens"
            last = runs.history(r.run_id, watched_metric(config))
            tags[f"hyprun.{unit}"] = str(last[-1][0] if last else 0)
        app_runs.finish_seed_run(r.job.config.tracking.uri, r.run_id, tags, "FINISHED")
        return runs.run(r.run_id)

    @staticmethod
    def _cancel(group: list[_Running]) -> None:
        for r in group:
            if not r.cancelled and not r.done:
                r.cancelled = True
                subprocess.run(["scancel", r.slurm_id], check=False, timeout=60)


def result_of(run) -> JobResult:
    """A finished job's result as its MLflow run records it."""
    tags, metrics = run.data.tags, run.data.metrics
    return JobResult(
        run_id=run.info.run_id,
        status=tags.get("hyprun.outcome", "interrupted"),
        steps=int(tags.get("hyprun.steps", 0)),
        tokens=int(tags.get("hyprun.tokens", 0)),
        train_loss=metrics.get("train/loss"),
        eval_loss=metrics.get("eval/loss"),
    )


def sacct_states(job_ids: Sequence[str]) -> dict[str, str]:
    """{job id: state} from Slurm's accounting (array tasks as ARRAY_TASK ids)."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    mains = sorted({j.split("_")[0] for j in job_ids})
    command = ["sacct", "-X", "-o", "JobID,State", "--parsable2"]
    for main in mains:
        command += ["-j", main]
    out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        return {}  # transient (slurmdbd busy): keep the last known states
    info = SlurmInfoWatcher().read_info(out.stdout)
    return {j: info[j]["State"].split()[0] for j in job_ids if j in info}


def safe_name(name: str) -> str:
    """A job name that cannot break out of its `#SBATCH --job-name=` line."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")[:64] or "hyprun"


def _tail(submitted) -> str:
    """The last line of a failed job's stderr, when there is one."""
    text = submitted.stderr() or ""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("srun:")]
    return f": {lines[-1][:300]}" if lines else ""


def slurm_states(jobs_by_run: dict[str, str]) -> dict[str, dict[str, str]]:
    """{run id: {Slurm job id: state}} for runs tagged with `slurm.jobs` (empty without sacct)."""
    import shutil

    ids = {run: [j for j in jobs.split(",") if j] for run, jobs in jobs_by_run.items()}
    wanted = [j for found in ids.values() for j in found]
    if not wanted or shutil.which("sacct") is None:
        return {}
    states = sacct_states(wanted)
    return {
        run: {j: states.get(j, "UNKNOWN") for j in found} for run, found in ids.items() if found
    }


def cancel_active(job_ids: str, timeout_s: float = 300) -> None:
    """Cancel the comma-separated Slurm jobs still queued or running and wait until they are
    over (a cancelled job checkpoints first, so its rerun resumes)."""
    ids = [j for j in job_ids.split(",") if j]
    active = [j for j, state in sacct_states(ids).items() if state in WAITING] if ids else []
    if not active:
        return
    subprocess.run(["scancel", *active], check=False, timeout=60)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(state in WAITING for state in sacct_states(active).values()):
            return
        time.sleep(2)
