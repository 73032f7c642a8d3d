"""The only module that writes to MLflow.

Metrics are buffered and sent with `log_batch` (one call per flush, ~40x cheaper than a
`log_metric` per value) by a background thread, so the training loop only appends to a list.
Every metric's MLflow step is the number of tokens seen, so the UI overlays runs with different
batch sizes at matched tokens.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

MAX_PARAM_CHARS = 6000
BATCH_LIMITS = {"metrics": 1000, "params": 100, "tags": 100}
CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


def redact(text: str) -> str:
    """Drop `user:password@` from any URI in `text`."""
    return CREDENTIALS.sub("***@", text)


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

    def __init__(self, client: MlflowClient, run_id: str, flush_every_s: float, resumed: bool):
        self.client = client
        self.run_id = run_id
        self.flush_every_s = flush_every_s
        self.resumed = resumed
        self._buffer: list[Metric] = []
        self._last_flush = time.monotonic()
        self._outbox: queue.Queue[list[Metric] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._system = None
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
    ) -> Tracker:
        """Resume `run_id` if given, else create a run (a child of `parent_run_id` if given)."""
        client = MlflowClient(tracking_uri=uri)
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
            return cls(client, run_id, flush_every_s, resumed=True)
        tags = dict(tags or {})
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = client.create_run(experiment_id(client, experiment), run_name=run_name, tags=tags)
        return cls(client, run.info.run_id, flush_every_s, resumed=False)

    def log_params(self, params: dict[str, str]) -> None:
        if self.resumed:  # already logged by the first attempt; MLflow params are write-once
            return
        self._send(params=[Param(k, v) for k, v in params.items()])

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._send(tags=[RunTag(k, redact(str(v))) for k, v in tags.items()])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if step <= self._watermark:
            return
        now = int(time.time() * 1000)
        self._buffer.extend(Metric(k, float(v), now, step) for k, v in metrics.items())
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def flush(self, wait: bool = False) -> None:
        """Hand the buffer to the writer thread; with `wait`, return once all of it is sent."""
        if self._buffer:
            self._outbox.put(self._buffer)
            self._buffer = []
        self._last_flush = time.monotonic()
        if wait:
            self._outbox.join()
            if self._error is not None:
                raise self._error

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def watch_system(self, every_s: float) -> None:
        """MLflow's system metrics (CPU, memory, disk, network; GPU with pynvml) every
        `every_s` seconds as `system/*`, continuing a resumed run's steps; 0 turns it off."""
        if every_s <= 0:
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self._system = SystemMetricsMonitor(self.run_id, sampling_interval=every_s,
                                            resume_logging=self.resumed,
                                            tracking_uri=self.client.tracking_uri)  # fmt: skip
        self._system.start()

    def finish(self, status: str) -> None:
        """Flush and close the run: FINISHED, FAILED (e.g. diverged) or KILLED (interrupted)."""
        if self._system is not None:
            self._system.finish()
        self.flush(wait=True)
        self._outbox.put(None)
        self.client.set_terminated(self.run_id, status=status)

    def _write(self) -> None:
        while (batch := self._outbox.get()) is not None:
            try:
                if self._error is None:
                    self._send(metrics=batch)
            except BaseException as error:  # surfaced by the next flush(wait=True)
                self._error = error
            finally:
                self._outbox.task_done()
        self._outbox.task_done()

    def _send(self, metrics=(), params=(), tags=()) -> None:
        for kind, items in (("metrics", metrics), ("params", params), ("tags", tags)):
            size = BATCH_LIMITS[kind]
            for i in range(0, len(items), size):
                self.client.log_batch(self.run_id, **{kind: list(items[i : i + size])})

    def _last_step(self, key: str) -> int:
        history = self.client.get_metric_history(self.run_id, key)
        return max((m.step for m in history), default=-1)


def experiment_id(client: MlflowClient, name: str) -> str:
    """The experiment's id, created on first use (two jobs may race to create it)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def read_run(
    uri: str, run_id: str
) -> tuple[dict[str, Any], dict[str, list[tuple[int, float]]], dict[str, str]]:
    """(resolved config, metric histories by key, tags) of a recorded run."""
    import yaml

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    path = client.download_artifacts(run_id, "config.yaml", _scratch())
    with open(path) as file:
        config = yaml.safe_load(file)
    series = {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
    }
    return config, series, dict(run.data.tags)


def latest_run(uri: str, experiment: str) -> str | None:
    """The newest top-level run of `experiment` that has ended, or None."""
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs(
        [found.experiment_id],
        filter_string="attributes.status != 'RUNNING'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def record_diagnosis(uri: str, run_id: str, document: dict[str, Any]) -> None:
    """The diagnosis as a JSON artifact on the run, and its headline as tags to filter on."""
    import json

    client = MlflowClient(tracking_uri=uri)
    client.log_text(run_id, json.dumps(document, indent=2, default=str), "diagnosis.json")
    findings = document.get("findings", [])
    tags = [RunTag("hyprun.question", str(document.get("question", ""))),
            RunTag("hyprun.top_finding", findings[0]["id"] if findings else "none")]  # fmt: skip
    client.log_batch(run_id, tags=tags)


def _scratch() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="hyprun-")
