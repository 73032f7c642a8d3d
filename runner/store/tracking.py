"""The only module that writes to MLflow.

Metrics are buffered and sent with `log_batch` (one call per flush, ~40x cheaper than a
`log_metric` per value) by a background thread, so the training loop only appends to a list.
Every metric's MLflow step is the number of tokens seen, so the UI overlays runs with different
batch sizes at matched tokens.

When the tracking server stops answering, the writer parks what it could not send in a spool
file on disk (runner/store/spool.py) and retries every few seconds; training goes on. `finish` waits
up to `outage_grace_s` for the server, else leaves the evidence on disk with the command that
uploads it.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyprun.runner.errors import TrackingOffline
from hyprun.runner.store.spool import Spool

if TYPE_CHECKING:
    from mlflow.entities import Metric
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

# MLflow is imported where it is used: its import takes seconds, and `hyprun status`, `--help`
# and every refusal import this module (for `redact`) without writing anything.

MAX_PARAM_CHARS = 6000
RETRY_S = 3.0  # how often an unanswered server is tried again
BATCH_LIMITS = {"metrics": 1000, "params": 100, "tags": 100}
CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")
# Environment variables whose values are secrets; shorter values than 8 characters are left
# alone, or every "1" and "true" in the evidence would be masked.
SECRET_NAMES = re.compile(r"(TOKEN|PASSWORD|SECRET|_KEY)$")


def redact(text: str) -> str:
    """Drop `user:password@` from any URI in `text`, and the value of every environment
    variable named like a secret (MLFLOW_TRACKING_TOKEN, *_PASSWORD, *_SECRET, *_KEY)."""
    text = CREDENTIALS.sub("***@", text)
    secrets = sorted(
        (v for k, v in os.environ.items() if SECRET_NAMES.search(k) and len(v) >= 8),
        key=len,
        reverse=True,
    )
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} -> {"a.b": "1"}: a config as MLflow params."""
    if isinstance(tree, dict):
        items: dict[str, str] = {}
        for key, value in tree.items():
            items.update(flatten(value, f"{prefix}{key}."))
        return items
    return {prefix[:-1]: redact(str(tree))[:MAX_PARAM_CHARS]}


class Tracker:
    """One MLflow run of one job, new or resumed, written through a metric buffer."""

    def __init__(
        self,
        client: MlflowClient,
        run_id: str,
        flush_every_s: float,
        resumed: bool,
        spool: Path | None = None,
        outage_grace_s: float = 600.0,
    ):
        self.client = client
        self.run_id = run_id
        self.flush_every_s = flush_every_s
        self.resumed = resumed
        self.outage_grace_s = outage_grace_s
        self.spool = Spool(spool, run_id) if spool else None
        self.offline_since: float | None = None
        """When the server stopped answering (None: it answers)."""
        self._buffer: list[Metric] = []
        self._last_flush = time.monotonic()
        self._outbox: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._system = None
        if self.spool:  # an earlier attempt's undelivered evidence goes first
            self.spool.deliver(client, self._send_kind)
        self._writer = threading.Thread(target=self._write, name="hyprun-mlflow", daemon=True)
        self._writer.start()
        # A resumed run recomputes the steps after its last checkpoint with identical values;
        # those already delivered before the interruption are not sent twice.
        self._watermark = self._last_step("train/loss") if resumed else -1

    @classmethod
    def open(
        cls,
        uri: str,
        experiment: str,
        *,
        run_id: str | None = None,
        run_name: str | None = None,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
        flush_every_s: float = 5.0,
        spool: Path | None = None,
        outage_grace_s: float = 600.0,
    ) -> Tracker:
        """Resume `run_id` if given, else create a run (a child of `parent_run_id` if given)."""
        # A server that stops answering must not stall the writer for minutes per call (MLflow's
        # default: 7 retries with backoff): fail fast, park the batch on disk, retry later.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
        from mlflow.tracking import MlflowClient

        from hyprun.runner.store import access, direct
        from hyprun.runner.store.outage import Patient

        uri = direct.sign_in(uri)  # MLflow prints each run's link from it: no password there
        client = MlflowClient(tracking_uri=uri)  # the writer's: it spools through an outage
        opening = Patient(client, uri)  # a job starting while the server restarts waits for it
        extra = {"spool": spool, "outage_grace_s": outage_grace_s}
        if run_id is not None:
            opening.update_run(run_id, status="RUNNING")
            return cls(client, run_id, flush_every_s, resumed=True, **extra)
        tags = {k: redact(str(v)) for k, v in (tags or {}).items()}
        tags.setdefault("hyprun.user", access.user(uri))  # who ran it, on a team's store
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run_name = redact(run_name) if run_name else run_name
        run = opening.create_run(experiment_id(opening, experiment), run_name=run_name, tags=tags)
        return cls(client, run.info.run_id, flush_every_s, resumed=False, **extra)

    def log_params(self, params: dict[str, str]) -> None:
        if self.resumed:  # already logged by the first attempt; MLflow params are write-once
            return
        from mlflow.entities import Param

        self._outbox.put(("params", [Param(k, v) for k, v in params.items()]))

    def set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        self._outbox.put(("tags", [RunTag(k, redact(str(v))) for k, v in tags.items()]))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if step <= self._watermark:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._buffer.extend(Metric(k, float(v), now, step) for k, v in metrics.items())
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def flush(self, wait: bool = False) -> None:
        """Hand the buffer to the writer thread; with `wait`, return once all of it is sent or,
        while the server is away, safe on disk."""
        if self._buffer:
            self._outbox.put(("metrics", self._buffer))
            self._buffer = []
        self._last_flush = time.monotonic()
        if wait:
            self._outbox.join()
            if self._error is not None:
                raise self._error

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, redact(text), artifact_file)

    def watch_system(self, every_s: float) -> None:
        """MLflow's system metrics (CPU, memory, disk, network; GPU with pynvml) every
        `every_s` seconds as `system/*`, continuing a resumed run's steps; 0 turns it off."""
        if every_s <= 0:
            return
        import logging

        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # start/stop chatter

        self._system = SystemMetricsMonitor(
            self.run_id,
            sampling_interval=every_s,
            resume_logging=self.resumed,
            tracking_uri=self.client.tracking_uri,
        )
        self._system.start()

    def finish(self, status: str | None) -> None:
        """Flush and close the run: FINISHED, FAILED (e.g. diverged) or KILLED (interrupted);
        None leaves its status to whoever owns the run (an app's, or hyprun's adapter).
        While the server is away, wait up to `outage_grace_s` for it; then raise TrackingOffline
        with the evidence on disk."""
        if self._system is not None:
            self._system.finish()
        if status is not None:
            self._outbox.put(("status", status))
        self.flush(wait=True)
        self._outbox.put(None)
        self._writer.join()
        deadline = time.monotonic() + self.outage_grace_s
        while self.offline_since is not None and time.monotonic() < deadline:
            time.sleep(RETRY_S)
            self._retry()
        if self.offline_since is not None:
            raise TrackingOffline(
                f"the tracking server has not answered for {self.outage_grace_s:.0f} s: the "
                f"run's remaining evidence is in {self.spool.path}; deliver it with: "
                f"hyprun upload {self.spool.path} --uri {redact(self.client.tracking_uri)}"
            )

    def _write(self) -> None:
        """The writer thread: send each batch in order; park it on disk while offline."""
        while True:
            try:
                item = self._outbox.get(timeout=RETRY_S)
            except queue.Empty:
                self._retry()
                continue
            try:
                if item is not None and self._error is None:
                    self._deliver(*item)
            except BaseException as error:  # surfaced by the next flush(wait=True)
                self._error = error
            finally:
                self._outbox.task_done()
            if item is None:
                return

    def _deliver(self, kind: str, items: Any) -> None:
        from mlflow.exceptions import MlflowException

        if self.offline_since is not None and self.spool is not None:
            self.spool.park(kind, items)
            return
        try:
            self._send_kind(kind, items)
        except MlflowException as error:
            if self.spool is None or not unreachable(error):
                raise
            self.offline_since = time.monotonic()
            self.spool.park(kind, items)

    def _retry(self) -> None:
        if self.offline_since is None or self.spool is None:
            return
        from mlflow.exceptions import MlflowException

        try:
            self.spool.deliver(self.client, self._send_kind)
        except MlflowException as error:
            if not unreachable(error):
                self._error = error
            return
        self.offline_since = None

    def _send_kind(self, kind: str, items: Any) -> None:
        if kind == "status":
            self.client.set_terminated(self.run_id, status=items)
            return
        size = BATCH_LIMITS[kind]
        for i in range(0, len(items), size):
            self.client.log_batch(self.run_id, **{kind: list(items[i : i + size])})

    def _last_step(self, key: str) -> int:
        history = self.client.get_metric_history(self.run_id, key)
        return max((m.step for m in history), default=-1)


def open_app_run(
    experiment: str | None = None, run_name: str | None = None, flush_every_s: float = 5.0
) -> tuple[Tracker, bool]:
    """The run a probe inside someone else's training loop logs into, and whether the probe
    owns it (and so ends it): the run named by MLFLOW_RUN_ID at MLFLOW_TRACKING_URI (what
    hyprun's app adapter sets), else this process's active MLflow run, else a new run in
    `experiment` (MLFLOW_EXPERIMENT_NAME, else "hyprun")."""
    import mlflow

    uri = os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()
    given = os.environ.get("MLFLOW_RUN_ID")
    if given:
        return Tracker.open(uri, "", run_id=given, flush_every_s=flush_every_s), False
    active = mlflow.active_run()
    if active is not None:
        run_id = active.info.run_id
        return Tracker.open(uri, "", run_id=run_id, flush_every_s=flush_every_s), False
    experiment = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "hyprun"
    return Tracker.open(uri, experiment, run_name=run_name, flush_every_s=flush_every_s), True


def unreachable(error: MlflowException) -> bool:
    """A server that did not answer (connection refused, timeout, 5xx), not a refused request."""
    text = str(error)
    return "API request to" in text or getattr(error, "error_code", "") in (
        "TEMPORARILY_UNAVAILABLE",
        "INTERNAL_ERROR",
        "ENDPOINT_NOT_FOUND",
    )


def experiment_id(client: MlflowClient, name: str) -> str:
    """The experiment's id, created on first use (two jobs may race to create it). A user who
    may only read it is refused here, before anything is written (runner/store/access.py)."""
    from hyprun.runner.store import access

    found = client.get_experiment_by_name(name)
    if found is not None:
        access.require_edit(client.tracking_uri, found.experiment_id, name)
        return found.experiment_id
    try:  # the kind makes MLflow 3's UI open the runs table, not its GenAI overview
        return client.create_experiment(
            name, tags={"mlflow.experimentKind": "custom_model_development"}
        )
    except Exception:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def patient(uri: str):
    """MLflow's client, waiting through a restart of the server (runner/store/outage.py)."""
    from mlflow.tracking import MlflowClient

    from hyprun.runner.store.outage import Patient

    return Patient(MlflowClient(tracking_uri=uri), uri)


def read_run(
    uri: str, run_id: str
) -> tuple[dict[str, Any], dict[str, list[tuple[int, float]]], dict[str, str]]:
    """(resolved config, metric histories by key, tags) of a recorded run; the config is the
    job's config.yaml, else the run's params (flat, dotted keys)."""
    import yaml
    from mlflow.exceptions import MlflowException

    client = patient(uri)
    run = client.get_run(run_id)
    try:
        config = yaml.safe_load(_artifact_text(client, run_id, "config.yaml"))
    except (MlflowException, OSError):
        # A run hyprun's job did not write (an app's, with the probe): its params, flat keys.
        config = dict(run.data.params)
    series = {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
    }
    return config, series, dict(run.data.tags)


def latest_run(uri: str, experiment: str) -> str | None:
    """The newest job run of `experiment` that has ended, or None."""

    client = patient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs(
        [found.experiment_id],
        filter_string="attributes.status != 'RUNNING'",
        order_by=["attributes.start_time DESC"],
        max_results=200,
    )
    # A job's run, not an investigation's or a test's summary run (they train nothing).
    return next((r.info.run_id for r in runs if "train/loss" in r.data.metrics), None)


def record_diagnosis(uri: str, run_id: str, document: dict[str, Any]) -> None:
    """The diagnosis as a JSON artifact on the run, and its headline as tags to filter on."""
    import json

    from mlflow.entities import RunTag

    client = patient(uri)
    client.log_text(run_id, redact(json.dumps(document, indent=2, default=str)), "diagnosis.json")
    findings = document.get("findings", [])
    tags = [
        RunTag("hyprun.question", str(document.get("question", ""))),
        RunTag("hyprun.top_finding", findings[0]["id"] if findings else "none"),
    ]
    client.log_batch(run_id, tags=tags)


def _artifact_text(client, run_id: str, path: str) -> str:
    """A text artifact's contents; its download folder is removed as soon as it is read (a
    `mkdtemp` folder used to be left in /tmp by every config read)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hyprun-") as folder:
        return Path(client.download_artifacts(run_id, path, folder)).read_text()


class RunReader:
    """Reads job runs back while they train: what a launcher needs, without importing MLflow."""

    def __init__(self, uri: str):

        self.client = patient(uri)

    def run(self, run_id: str):
        return self.client.get_run(run_id)

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in self.client.get_metric_history(run_id, key))

    def seed_run(self, parent_run_id: str, seed: int) -> str | None:
        """The run of the job with this seed below `parent_run_id`, once the job has made it."""
        experiment = self.client.get_run(parent_run_id).info.experiment_id
        found = self.client.search_runs(
            [experiment],
            filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}' "
            f"and tags.`hyprun.seed` = '{seed}'",
        )
        return found[0].info.run_id if found else None
