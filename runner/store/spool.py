"""Evidence that could not reach the tracking server yet, kept on local disk until it can.

One JSON line per batch (`metrics`, `params`, `tags`, or the run's final `status`), appended and
fsynced in the order the job produced them, delivered in that order when the server answers.
The file lives in the job's checkpoint folder, so a resumed job delivers it first; if the server
never comes back, `hyprun upload FILE` delivers it later.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: MLflow's import takes seconds (runner/store/direct.py)
    from mlflow.tracking import MlflowClient


class Spool:
    """The undelivered batches of one MLflow run."""

    def __init__(self, path: Path, run_id: str):
        self.path, self.run_id = Path(path), run_id

    def __bool__(self) -> bool:
        return self.path.exists()

    def park(self, kind: str, items: list[Any] | str) -> None:
        """Append one batch (`status`: the run's final status) durably."""
        if kind == "status":
            body: Any = items
        else:
            body = [_fields(item) for item in items]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as file:
            file.write(json.dumps({"run_id": self.run_id, "kind": kind, "items": body}) + "\n")
            file.flush()
            os.fsync(file.fileno())

    def deliver(self, client: MlflowClient, send) -> int:
        """Send every parked batch in order with `send(kind, items)` (status: terminate the run);
        remove the file once all went out. Returns the batches delivered; raises on the first
        failure, leaving the file whole (MLflow drops metric points it already has)."""
        if not self:
            return 0
        lines = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        for batch in lines:
            if batch["kind"] == "status":
                client.set_terminated(batch["run_id"], status=batch["items"])
            else:
                entity = _entity(batch["kind"])
                send(batch["kind"], [entity(*fields) for fields in batch["items"]])
        self.path.unlink()
        return len(lines)


def _fields(item: Any) -> list[Any]:
    from mlflow.entities import Metric

    if isinstance(item, Metric):
        return [item.key, item.value, item.timestamp, item.step]
    return [item.key, item.value]


def upload(path: Path, uri: str) -> int:
    """`hyprun upload`: deliver a spool left by a job whose server never came back."""
    from hyprun.runner.errors import BadInput

    if not Path(path).exists():
        raise BadInput(f"no spool file {path}: it was delivered already, or the path is wrong")
    first = json.loads(Path(path).read_text().splitlines()[0])
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run_id = first["run_id"]

    def send(kind: str, items: list[Any]) -> None:
        client.log_batch(run_id, **{kind: items})

    return Spool(path, run_id).deliver(client, send)


def _entity(kind: str):
    """The MLflow entity a spooled batch of `kind` is made of."""
    from mlflow.entities import Metric, Param, RunTag

    return {"metrics": Metric, "params": Param, "tags": RunTag}[kind]
