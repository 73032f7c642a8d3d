"""A user's own Hydra app as hyprun's job.

    hyprun baseline --app my_pkg.train:main [overrides]      (or `app:` in hyprun.yaml)

hyprun composes the app's own config tree (the folder and name its `@hydra.main` names, read from
its source without importing it, or `config_path`/`config_name` in hyprun.yaml), applies the
one-variable rule to that tree, and runs the app as it is: in this process, in a subprocess, or as
a Slurm job through the same launchers as our own job. What hyprun cannot read from a config is
declared in `hyprun.yaml` (runner/launch/declaration.py): which keys are the seed, the data
order, the budget and the held-out set (no hypothesis may change them), and which metric a
verdict compares.

One seed of the app is one MLflow run below the baseline's or the test's run. hyprun makes it
before the app starts and hands it over through the environment (MLFLOW_RUN_ID,
MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME/ID, HYPRUN_SEED): `mlflow.start_run()`, the HF
Trainer's MLflow callback and Lightning's `MLFlowLogger(run_id=...)` all log into it. Afterwards
hyprun reads the declared metric back by MLflow step and tags the run with how the app ended
(`hyprun.outcome`, `hyprun.steps`), as our own job does, so the controller reads both alike.

`hydra.run.dir` is set to one folder per seed run, the same on every attempt: an app that keeps
its checkpoints under `${hydra:runtime.output_dir}` resumes after a Slurm requeue.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hyprun.diag.features import ACCUMULATION_TAG, KNOBS_TAG, METRIC_TAG
from hyprun.diag.metric import MetricSpec
from hyprun.hypotheses.schema import Card
from hyprun.runner import provenance
from hyprun.runner.compose import APP_OUTPUT_DIR, compose
from hyprun.runner.errors import BadInput
from hyprun.runner.job import stop, threads
from hyprun.runner.job.result import JobResult
from hyprun.runner.launch.app_preflight import call_preflight, check_overrides
from hyprun.runner.launch.declaration import (
    DECLARATION,
    Declaration,
    find_declaration,
    find_source,
    load_declaration,
    read_decorator,
)
from hyprun.runner.launch.knobs import Knob, Translation, resolve, translate
from hyprun.runner.launch.watch import MetricWatch
from hyprun.runner.store import app_runs
from hyprun.runner.store.tracking import flatten

EXIT_INTERRUPTED = 75


@dataclass(frozen=True)
class HydraApp:
    """A user's Hydra app with its declarations: everything hyprun needs to run and judge it."""

    target: str
    config_dir: str
    config_name: str
    version_base: str | None
    declaration: Declaration
    declared_in: str
    source: str

    @classmethod
    def load(cls, target: str | None) -> HydraApp | None:
        """The app named by --app or by hyprun.yaml in this folder; None when neither names one
        (our own job). BadInput for an app without complete declarations."""
        here = find_declaration(None)
        declared = load_declaration(here) if here else None
        target = target or (declared.app if declared else None)
        if target is None:
            return None
        decorator = read_decorator(target)
        path = here or find_declaration(decorator.source.parent)
        if path is None:
            raise BadInput(
                f"--app {target}: no {DECLARATION} in {Path.cwd()} or {decorator.source.parent}: "
                "write one declaring controlled: (seed, data_order, budget, heldout) and metric:"
            )
        declared = declared or load_declaration(path)
        config_path = declared.config_path or decorator.config_path
        folder = path.parent if declared.config_path else decorator.source.parent
        config_name = declared.config_name or decorator.config_name
        if config_path is None or config_name is None:
            raise BadInput(
                f"{path}: the app's @hydra.main names no literal config_path/config_name: "
                "add config_path: and config_name: to it"
            )
        if config_path.startswith("pkg://"):
            package = config_path[len("pkg://") :].replace("/", ".")
            config_dir = find_source(package + ".__init__").parent
        else:
            config_dir = (folder / config_path).resolve()
        if not (config_dir / f"{config_name}.yaml").is_file():
            raise BadInput(
                f"{path}: no config {config_name}.yaml in {config_dir}: fix config_path/config_name"
            )
        return cls(
            target=target,
            config_dir=str(config_dir),
            config_name=config_name,
            version_base=decorator.version_base,
            declaration=declared,
            declared_in=str(path.resolve()),
            source=str(decorator.source.resolve()),
        )

    def record(self) -> dict[str, Any]:
        """What the baseline keeps, so its tests run the same app under the same declarations."""
        return {
            "target": self.target,
            "config_dir": self.config_dir,
            "config_name": self.config_name,
            "version_base": self.version_base,
            "declaration": self.declaration.model_dump(),
            "declared_in": self.declared_in,
            "source": self.source,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> HydraApp:
        return cls(**{**record, "declaration": Declaration.model_validate(record["declaration"])})

    # -- its config -------------------------------------------------------------------------
    def compose(
        self, overrides: list[str] | tuple[str, ...], output_dir: str = APP_OUTPUT_DIR
    ) -> DictConfig:
        return compose(
            list(overrides),
            self.config_name,
            config_dir=self.config_dir,
            version_base=self.version_base,
            output_dir=output_dir,
        )

    def controlled_keys(self) -> dict[str, list[str]]:
        """{declaration entry: the config keys it names}."""
        found = {}
        for entry, keys in self.declaration.controlled.model_dump().items():
            found[entry] = [keys] if isinstance(keys, str) else list(keys)
        return found

    def check(self, overrides: list[str]) -> DictConfig:
        """Compose the app's config; every declared key must be in it (the controlled ones and
        the knobs hyprun.yaml maps), the seed a whole number."""
        cfg = self.compose(overrides)
        declared = [
            (f"controlled.{entry}", key)
            for entry, keys in self.controlled_keys().items()
            for key in keys
        ]
        declared += [
            (f"knobs.{k.name}", k.key) for k in self.knobs().values() if k.source == DECLARATION
        ]
        for entry, key in declared:
            if OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
                raise BadInput(
                    f"{self.declared_in}: {entry} names {key!r}, which is not a key "
                    f"of the app's config ({self.config_dir}/{self.config_name}.yaml): "
                    "fix the key"
                )
        seed = OmegaConf.select(cfg, self.declaration.controlled.seed)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise BadInput(
                f"{self.declared_in}: controlled.seed names "
                f"{self.declaration.controlled.seed!r}, which is {seed!r}: it must be an integer"
            )
        return cfg

    def admit(self, overrides: list[str]) -> DictConfig:
        """`check`, then the app's own preflight (hyprun.yaml's `preflight:`) on the config."""
        cfg = self.check(overrides)
        if self.declaration.preflight:
            call_preflight(self.declaration.preflight, cfg, self.declared_in)
        return cfg

    def refuse(self, baseline_overrides: list[str], overrides: tuple[str, ...]) -> None:
        """A test's overrides checked before it takes a number (runner/launch/app_preflight.py):
        types against the baseline's values, new keys nothing reads, knob values, the declared
        keys, the app's own preflight. BadInput names the first problem and its fix."""
        baseline = OmegaConf.to_container(self.compose(baseline_overrides), resolve=True)
        test = self.check([*baseline_overrides, *overrides])
        check_overrides(
            overrides,
            baseline,
            OmegaConf.to_container(test, resolve=True),
            self.knobs(),
            self.declaration.knobs,
            self.groups(),
        )
        if self.declaration.preflight:  # last: ours name the override, the app's its own terms
            call_preflight(self.declaration.preflight, test, self.declared_in)

    # -- the cards, in its keys -----------------------------------------------------------
    def knobs(self) -> dict[str, Knob]:
        """The cards' knobs this app maps: its preset's, then hyprun.yaml's own entries."""
        return resolve(self.declaration.knobs)

    def translate(self, card: Card, baseline_overrides: list[str]) -> Translation:
        """`card`'s delta in this app's keys, on its baseline's config (or why it does not
        apply)."""
        baseline = OmegaConf.to_container(self.compose(baseline_overrides), resolve=True)
        return translate(card, self.knobs(), baseline)

    def source_digest(self) -> dict[str, object]:
        """What the app's code and configs are now: its module's folder and its config folder
        (runner/provenance.py), so an edit outside git is seen as drift too."""
        return provenance.source_digest([Path(self.source).parent, Path(self.config_dir)])

    def rules(self) -> dict[str, Any]:
        """The one-variable rule's table for this app, in runner/control/controlled.yaml's shape:
        each declared key with why it is controlled; the app's bookkeeping keys ignored."""
        why = {
            "seed": "the seeds are the baseline's",
            "data_order": "the data order is fixed by the baseline",
            "budget": "the budget is fixed by the baseline",
            "heldout": "the held-out set is fixed by the baseline",
        }
        controlled = [
            {"prefix": key, "why": f"{why[entry]}: declared in {DECLARATION}"}
            for entry, keys in self.controlled_keys().items()
            for key in keys
        ]
        return {"controlled": controlled, "ignored": ["hydra.", *self.declaration.ignored]}

    def groups(self) -> set[str]:
        """The app's config groups: folders of its config folder."""
        root = Path(self.config_dir)
        return {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")}

    def budget(self, overrides: list[str]) -> int:
        """The declared budget's value (the first key when several are declared)."""
        key = self.controlled_keys()["budget"][0]
        return int(OmegaConf.select(self.check(overrides), key))

    def drift_key(self, overrides: list[str]) -> str:
        from hyprun.runner.job.checkpoint import config_hash

        return config_hash(self.compose(overrides), exclude=tuple(self.declaration.ignored))

    def git_sha(self) -> str:
        """The commit of the app's own code (its checkout, not hyprun's)."""
        return provenance.git_state(Path(self.source).parent)[0]

    def metric(self, spec: MetricSpec | None = None) -> MetricSpec:
        """The declared metric in place of our `eval/loss` (a card's min effect kept)."""
        declared = self.declaration.metric
        if spec is None:
            return MetricSpec(declared.name, declared.direction, declared.min_effect)
        if spec.metric == "eval/loss":
            return MetricSpec(declared.name, declared.direction, spec.min_effect)
        return spec

    def accumulation(self, cfg: DictConfig) -> int | str:
        """The micro-batches per optimizer step the app's config declares (its ds.grad_accum
        knob), or "unknown" where no knob maps it (diag/features.py reads it)."""
        knob = self.knobs().get("ds.grad_accum")
        if knob is None:
            return "unknown"
        value = OmegaConf.select(cfg, knob.key, default=knob.default)
        return value if isinstance(value, int) and not isinstance(value, bool) else "unknown"

    # -- its jobs ---------------------------------------------------------------------------
    def job_config(
        self,
        uri: str,
        experiment: str,
        overrides: list[str],
        seed: int,
        parent: str,
        name: str,
        tags: dict[str, str],
    ) -> DictConfig:
        """One seed of the app, as the launchers take it: `app` says what to run, `tracking`
        where it records (the same node our job has, so a launcher finds its run alike)."""
        seed_key = self.declaration.controlled.seed
        direction = self.declaration.metric.direction
        cfg = self.check([*overrides, f"{seed_key}={seed}"])
        budget = self.controlled_keys()["budget"][0]
        return OmegaConf.create(
            {
                "app": {
                    "record": self.record(),
                    "overrides": [*overrides, f"{seed_key}={seed}"],
                    "cwd": str(Path.cwd()),
                    "budget": OmegaConf.select(cfg, budget),
                },
                "tracking": {
                    "uri": uri,
                    "experiment": experiment,
                    "parent_run_id": parent,
                    "run_name": name,
                    "tags": {
                        **tags,
                        "hyprun.seed": str(seed),
                        "hyprun.app": self.target,
                        # which series is the app's held-out metric (diag/features.py)
                        METRIC_TAG: json.dumps(
                            {"name": self.declaration.metric.name, "direction": direction}
                        ),
                        ACCUMULATION_TAG: str(self.accumulation(cfg)),
                        # what diagnose needs to name cards in the app's keys
                        KNOBS_TAG: json.dumps(
                            {name: knob.as_dict() for name, knob in self.knobs().items()}
                        ),
                    },
                },
            }
        )


_ABSENT = object()


class AppFailed(Exception):
    """The app crashed, or logged nothing hyprun can compare: no evidence (an error verdict)."""


def is_app(config: DictConfig | dict) -> bool:
    return "app" in config


def run_app(
    config: DictConfig,
    process: str | None = None,
    on_eval: Callable[[int, float], bool] | None = None,
) -> JobResult:
    """Run one seed of the app to its end; its result as MLflow records it. `process`:
    in_process | subprocess (default: as declared). `on_eval(step, value)` is called with each
    value of the declared metric as the app logs it (runner/launch/watch.py); True asks the app
    to stop (runner/job/stop.py), and the seed ends `stopped` (early rejection)."""
    job, tracking = config.app, config.tracking
    app = HydraApp.from_record(OmegaConf.to_container(job.record))
    overrides = list(job.overrides)
    seed = int(tracking.tags["hyprun.seed"])
    run_dir = Path(job.cwd) / ".hyprun" / "apps" / f"{tracking.parent_run_id}-seed{seed}"
    cfg = app.compose(overrides, output_dir=str(run_dir))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    tags = {
        **{k: str(v) for k, v in tracking.tags.items()},
        "hyprun.git_sha": app.git_sha(),
        "hyprun.config_hash": app.drift_key(overrides),
    }
    attempt = {"hyprun.outcome": "running", **provenance.slurm_tags()}
    # The thread count our own job would run with (OMP_NUM_THREADS from the user wins).
    chosen = threads.choose(None)
    run_id, experiment_id, _ = app_runs.open_seed_run(
        tracking.uri,
        tracking.experiment,
        tracking.parent_run_id,
        seed,
        tracking.run_name,
        tags,
        attempt,
        {
            **{f"config.{k}": v for k, v in flatten(resolved).items()},
            "runtime.threads": str(chosen.count),
            "runtime.threads_from": chosen.source,
        },
        OmegaConf.to_yaml(cfg, resolve=True),
    )
    env = {
        **threads.environment(chosen.count),
        "MLFLOW_TRACKING_URI": tracking.uri,
        "MLFLOW_RUN_ID": run_id,
        "MLFLOW_EXPERIMENT_ID": experiment_id,
        "MLFLOW_EXPERIMENT_NAME": tracking.experiment,
        "HYPRUN_SEED": str(seed),
        "HYPRUN_RUN_DIR": str(run_dir),
    }
    # The config folder hyprun composed, absolute: Hydra resolves a relative config_path
    # differently when the app is imported than when it runs as a script.
    where = ["--config-path", app.config_dir, "--config-name", app.config_name]
    argv = [*overrides, f"hydra.run.dir={run_dir}", *where]
    process = process or app.declaration.run
    watching = (tracking.uri, run_id, app.declaration.metric.name, on_eval)
    if process == "subprocess":
        child = _Child(app.target, argv, env, Path(job.cwd))
        with MetricWatch(*watching, child.stop) as watch:
            code, reason = child.wait()
    else:  # a probe in the app honours the flag; an app without one runs to its end (stop.py)
        with (
            threads.limited(chosen.count),
            stop.listening(),
            MetricWatch(*watching, stop.request) as watch,
        ):
            code, reason = _in_process(app.target, argv, env, Path(job.cwd))
    return _read_back(app, tracking.uri, run_id, code, reason, stopped=watch.fired)


def _read_back(
    app: HydraApp, uri: str, run_id: str, code: int, reason: str, stopped: bool = False
) -> JobResult:
    """How the app ended, from its exit and the metric it logged; recorded on its run.
    `stopped`: hyprun asked it to stop (early rejection): not an error, however it exited."""
    metric = app.declaration.metric
    if stopped:
        return _stopped(app, uri, run_id)
    if code > 0 and code != EXIT_INTERRUPTED:
        app_runs.finish_seed_run(uri, run_id, {"hyprun.outcome": "crashed"}, "FAILED")
        raise AppFailed(f"the app {app.target} failed (exit {code}){reason}")
    points = app_runs.history(uri, run_id, metric.name)
    if code != 0:  # a signal (negative) or the conventional 75: rerun to resume
        status = "interrupted"
    elif not points:
        logged = ", ".join(app_runs.logged_metrics(uri, run_id)) or "nothing"
        app_runs.finish_seed_run(uri, run_id, {"hyprun.outcome": "no-metric"}, "FAILED")
        raise AppFailed(
            f"the app {app.target} logged no {metric.name!r} to its MLflow run {run_id} "
            f"(it logged: {logged}): log it there, or name the metric it logs in "
            f"{app.declared_in} (metric.name)"
        )
    else:
        status = "completed" if math.isfinite(points[-1][1]) else "diverged"
    last = points[-1][0] if points else 0
    steps, tokens = (last, 0) if metric.step == "steps" else (0, last)
    # only the count the app's metric step measures: a 0 in the other would read as measured
    tags = {"hyprun.outcome": status, f"hyprun.{metric.step}": last}
    ended = {"completed": "FINISHED", "diverged": "FAILED"}.get(status, "KILLED")
    app_runs.finish_seed_run(uri, run_id, tags, ended)
    value = points[-1][1] if points else None
    return JobResult(run_id, status, steps, tokens, None, value)


def _stopped(app: HydraApp, uri: str, run_id: str) -> JobResult:
    """A seed hyprun stopped early, with how far it trained (app_runs.trained_to)."""
    metric = app.declaration.metric
    unit = metric.step
    points = app_runs.history(uri, run_id, metric.name)
    last = app_runs.trained_to(uri, run_id, metric.name, unit)
    app_runs.finish_seed_run(
        uri, run_id, {"hyprun.outcome": "stopped", f"hyprun.{unit}": last}, "FINISHED"
    )
    steps, tokens = (last, 0) if unit == "steps" else (0, last)
    return JobResult(run_id, "stopped", steps, tokens, None, points[-1][1] if points else None)


def _importable(cwd: Path) -> None:
    if str(cwd) not in sys.path:
        sys.path.insert(0, str(cwd))


def _in_process(target: str, argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """Call the app's decorated main as its command line would, in this process."""
    from hydra.core.global_hydra import GlobalHydra

    _importable(cwd)
    module, _, function = target.partition(":")
    main = getattr(importlib.import_module(module), function)
    code, reason = 0, ""
    # HYDRA_FULL_ERROR: Hydra re-raises the app's exception instead of printing it and exiting.
    with (
        _environment({**env, "HYDRA_FULL_ERROR": "1"}),
        _argv([module, *argv]),
        app_runs.fluent_state(env["MLFLOW_TRACKING_URI"]),
    ):
        try:
            main()
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except Exception as error:
            code, reason = 1, f": {type(error).__name__}: {' '.join(str(error).split())[:300]}"
        finally:
            GlobalHydra.instance().clear()
    return code, reason


class _Child:
    """The app's decorated main in its own Python process, which handles hyprun's stop request
    (runner/job/stop.py) from its first line, and exits 75 when asked to stop, even where a
    probe ended its loop and it returned (so a Slurm job stopped by `scancel` reads stopped)."""

    def __init__(self, target: str, argv: list[str], env: dict[str, str], cwd: Path):
        module, _, function = target.partition(":")
        code = (
            "import sys; from importlib import import_module; "
            "from hyprun.runner.job import stop; stop.listen(); "
            f"sys.argv = [{module!r}, *sys.argv[1:]]; "
            f"import_module({module!r}).{function}(); "
            "sys.exit(stop.EXIT_STOPPED if stop.requested() else 0)"
        )
        path = os.pathsep.join(p for p in (str(cwd), os.environ.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, *argv],
            cwd=cwd,
            env={**os.environ, **env, "PYTHONPATH": path},
            stderr=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> None:
        self.process.send_signal(stop.SIGNAL)

    def wait(self) -> tuple[int, str]:
        """(exit code, its last stderr line) once the app has ended."""
        _, stderr = self.process.communicate()
        sys.stderr.write(stderr)
        lines = [line for line in stderr.splitlines() if line.strip()]
        return self.process.returncode, f": {lines[-1][:300]}" if lines else ""


@contextmanager
def _environment(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _argv(argv: list[str]):
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved


class AppJob:
    """What a Slurm task runs for an app: one seed, the app in its own process (so Slurm's
    signals reach it as they would on any cluster). Checkpointable like our TrainJob: a
    time-limit warning requeues the job, and the rerun logs into the same MLflow run."""

    def __init__(self, config: dict[str, Any]):
        self.config = config

    def __call__(self) -> JobResult:
        return run_app(OmegaConf.create(self.config), process="subprocess")

    def checkpoint(self, *args: Any, **kwargs: Any):
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)
