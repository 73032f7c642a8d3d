"""runner/store/direct.py reads what MLflow's own client reads, from sqlite and from a server."""

from __future__ import annotations

import math
import time

import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from hyprun.runner.errors import BadInput
from hyprun.runner.store import direct
from tests.helpers import free_port


def _record(client: MlflowClient, experiment: str) -> str:
    """An experiment with runs that tie on start time, a deleted run, NaN and inf metrics, long
    values, and a child run; returns its id."""
    experiment_id = client.create_experiment(experiment)
    start = int(time.time() * 1000)
    parent = client.create_run(experiment_id, start_time=start, tags={"role": "investigation"})
    parent_id = parent.info.run_id
    for index in range(5):
        run = client.create_run(
            experiment_id,
            start_time=start + index // 2,  # pairs tie: the run id breaks the tie
            run_name=f"child {index}",
            tags={"mlflow.parentRunId": parent_id, "hyprun.seed": str(index)},
        )
        run_id = run.info.run_id
        client.log_batch(
            run_id,
            metrics=[
                Metric("train/loss", 3.0 - index, 0, 1),
                Metric("train/loss", 2.0 - index, 0, 2),  # the latest step is the value
                Metric("eval/loss", math.nan if index == 1 else math.inf, 0, 2),
            ],
            params=[Param("optim.lr", "x" * 5000)],
            tags=[RunTag("hyprun.outcome", "completed"), RunTag("note", "a quoted 'value'")],
        )
        if index == 4:
            client.delete_run(run_id)
        elif index == 3:
            client.set_terminated(run_id, "FAILED")
    return parent_id


def _same(mine, theirs) -> None:
    """A direct Run against MLflow's: every field hyprun reads."""
    assert mine.info.run_id == theirs.info.run_id
    for field in ("experiment_id", "run_name", "status", "start_time", "end_time"):
        assert getattr(mine.info, field) == getattr(theirs.info, field), field
    assert mine.data.tags == theirs.data.tags
    assert mine.data.params == theirs.data.params
    assert mine.data.metrics.keys() == theirs.data.metrics.keys()
    for key, value in mine.data.metrics.items():
        other = theirs.data.metrics[key]
        assert (math.isnan(value) and math.isnan(other)) or value == other, key


@pytest.fixture(params=["sqlite", "server"])
def store_uri(request, workdir):
    if request.param == "sqlite":
        return f"sqlite:///{workdir}/mlflow.db"
    return request.getfixturevalue("mlflow_server")


def test_direct_reads_equal_mlflow_client_reads(store_uri, request):
    client = MlflowClient(tracking_uri=store_uri)
    experiment = f"reads-{request.node.callspec.id}-{time.time_ns()}"
    parent_id = _record(client, experiment)
    reads = direct.reader(store_uri, lambda: client)
    assert not isinstance(reads, direct.ClientReads), "sqlite and http are read directly"
    by_client = direct.ClientReads(lambda: client)

    experiment_id = reads.experiment_id(experiment)
    assert experiment_id == by_client.experiment_id(experiment)
    assert reads.experiment_id("no such experiment") is None
    assert reads.experiment_name(experiment_id) == experiment
    others = reads.other_experiment_ids(experiment)
    assert sorted(others) == sorted(by_client.other_experiment_ids(experiment))
    assert experiment_id not in others

    for tags in ({"mlflow.parentRunId": parent_id}, {"role": "investigation"}, {"role": "x"}):
        mine, theirs = reads.search([experiment_id], tags), by_client.search([experiment_id], tags)
        assert [r.info.run_id for r in mine] == [r.info.run_id for r in theirs], tags
        for a, b in zip(mine, theirs, strict=True):
            _same(a, b)
    assert len(reads.search([experiment_id], {"mlflow.parentRunId": parent_id})) == 4
    assert len(reads.search([experiment_id], {"mlflow.parentRunId": parent_id}, 3)) == 3
    _same(reads.get_run(parent_id), client.get_run(parent_id))
    with pytest.raises(LookupError):
        reads.get_run("0" * 32)


def test_a_store_not_yet_made_reads_empty_and_stays_unmade(workdir):
    reads = direct.reader(f"sqlite:///{workdir}/none.db", lambda: None)
    assert reads.experiment_id("hyprun") is None
    assert reads.search(["0"], {"a": "b"}) == []
    assert list(workdir.iterdir()) == [], "reading must not create the store"


def test_a_server_that_does_not_answer_is_one_line_of_bad_input():
    reads = direct.reader(f"http://127.0.0.1:{free_port()}", lambda: None)
    with pytest.raises(BadInput, match="does not answer"):
        reads.experiment_id("hyprun")


def test_other_stores_and_auth_plugins_read_through_mlflow(workdir, monkeypatch):
    assert isinstance(direct.reader(f"file://{workdir}/mlruns", lambda: None), direct.ClientReads)
    monkeypatch.setenv("MLFLOW_TRACKING_AUTH", "some_plugin")
    assert isinstance(direct.reader("http://127.0.0.1:5000", lambda: None), direct.ClientReads)
