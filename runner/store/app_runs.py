"""The MLflow side of a user's app as a job: the run hyprun hands it, and what hyprun reads back.

hyprun makes the seed's run before the app starts (a child of the baseline or test run, tagged
with its seed), so the app only has to log into the run named by MLFLOW_RUN_ID. A rerun of the
same seed (a Slurm requeue, a controller restarted after a crash) finds that run again instead of
making a second one.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any

from hyprun.runner.store.tracking import BATCH_LIMITS, experiment_id, redact


def open_seed_run(
    uri: str,
    experiment: str,
    parent_run_id: str,
    seed: int,
    run_name: str,
    tags: dict[str, str],
    attempt_tags: dict[str, str],
    params: dict[str, str],
    config_yaml: str,
) -> tuple[str, str, bool]:
    """(run id, experiment id, resumed): the run of `seed` below `parent_run_id`, made once;
    `attempt_tags` (which Slurm job runs it, how often requeued) are set on every attempt."""
    # MLflow is imported where used, here and below: `hyprun status` and the refusals import
    # this module through the launchers and must not wait seconds on MLflow's import.
    from mlflow.entities import Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment_id_ = experiment_id(client, experiment)
    found = client.search_runs(
        [experiment_id_],
        filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}' "
        f"and tags.`hyprun.seed` = '{seed}'",
    )
    if found:
        run_id = found[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        client.log_batch(run_id, tags=[RunTag(k, redact(str(v))) for k, v in attempt_tags.items()])
        return run_id, experiment_id_, True
    tags = {**tags, **attempt_tags, "mlflow.parentRunId": parent_run_id}
    tags = {k: redact(str(v)) for k, v in tags.items()}
    run = client.create_run(experiment_id_, run_name=run_name, tags=tags)
    run_id = run.info.run_id
    items = [Param(k, redact(v)[:6000]) for k, v in params.items()]
    size = BATCH_LIMITS["params"]
    for i in range(0, len(items), size):
        client.log_batch(run_id, params=items[i : i + size])
    client.log_text(run_id, redact(config_yaml), "config.yaml")
    return run_id, experiment_id_, False


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of a metric, one value per step: the last one logged, since an app that
    restarts from an earlier checkpoint logs some steps again."""
    from mlflow.tracking import MlflowClient

    return last_per_step(MlflowClient(tracking_uri=uri).get_metric_history(run_id, key))


def last_per_step(metrics) -> list[tuple[int, float]]:
    latest: dict[int, Any] = {}
    for m in sorted(metrics, key=lambda m: (m.timestamp, m.step)):
        latest[m.step] = m.value
    return sorted(latest.items())


def trained_to(uri: str, run_id: str, metric: str, unit: str) -> int:
    """How far a run's app trained, in `unit`: the furthest step of `metric`, or of the probe's
    `train/loss` (logged every step) when the probe counts in the same unit."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    keys = [metric]
    if client.get_run(run_id).data.tags.get("hyprun.step_unit") == unit:
        keys.append("train/loss")
    return max((m.step for key in keys for m in client.get_metric_history(run_id, key)), default=0)


def logged_metrics(uri: str, run_id: str) -> list[str]:
    """The metric keys a run holds, to name them when the declared one is missing."""
    from mlflow.tracking import MlflowClient

    return sorted(MlflowClient(tracking_uri=uri).get_run(run_id).data.metrics)


def finish_seed_run(uri: str, run_id: str, tags: dict[str, Any], status: str) -> None:
    """Record how the app ended (`hyprun.outcome`, steps, tokens) and close the run."""
    from mlflow.entities import RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    client.log_batch(run_id, tags=[RunTag(k, redact(str(v))) for k, v in tags.items()])
    client.set_terminated(run_id, status=status, end_time=int(time.time() * 1000))


@contextmanager
def fluent_state(uri: str):
    """MLflow's process-wide state as a fresh process would have it, for an app run in this
    one: the tracking URI it was handed (an earlier app may have set another, and
    `set_tracking_uri` outlives the app), and no run left active afterwards (MLflow refuses to
    start a run while another is active), and no experiment left pinned."""
    import mlflow
    from mlflow.tracking import fluent

    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        # An app's `mlflow.set_experiment` (the HF Trainer's integration calls it) pins an
        # experiment id for the rest of the process; MLflow has no public way to unset it.
        fluent._active_experiment_id = None
