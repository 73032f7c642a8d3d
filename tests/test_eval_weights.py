"""The run's own held-out loss against the probe's read of the trained weights (diag/features.py
eval_over_heldout, the finding eval_reads_other_weights): two samples of one model's held-out
loss agree, unless the evaluation reads other weights. Through a real baseline of the corpus's
plain-loop app (its launcher records which series is the metric): an EMA whose update runs away
from the weights (ostris/ai-toolkit#1034) is found, by the EMA's own read first, a healthy EMA
that lags them is not."""

from __future__ import annotations

import json

import pytest

from hyprun.diag.evidence import Evidence
from hyprun.diag.features import METRIC_TAG, features
from hyprun.diag.triage import triage
from hyprun.runner.control.baseline import record_baseline
from hyprun.runner.control.diagnose import diagnose
from hyprun.runner.launch.app import HydraApp
from hyprun.runner.store.investigation import Store

SCAN = {"step/loss_x0": [(0, 5.5), (64, 1.2)]}


def ratio(metric: str, direction: str, points) -> float | None:
    tags = {METRIC_TAG: json.dumps({"name": metric, "direction": direction})}
    found = features(Evidence({}, {metric: points, **SCAN}, tags, [])).get("eval_over_heldout")
    return found.value if found else None


def test_only_a_loss_to_minimise_is_read_against_the_probe():
    assert ratio("eval_loss", "min", [(40, 7.0), (80, 7.2)]) == pytest.approx(6.0)
    assert ratio("eval_accuracy", "max", [(80, 0.3)]) is None  # another unit
    assert ratio("eval_loss", "min", []) is None
    # worse after the last probe: the training loss says so too, so the weights are the same
    blown_up = {"eval_loss": [(80, 7.2)], "train/loss": [(s, 7.0) for s in range(70, 81)]}
    tags = {METRIC_TAG: json.dumps({"name": "eval_loss", "direction": "min"})}
    late = features(Evidence({}, {**blown_up, **SCAN}, tags, []))["eval_over_heldout"]
    assert late.value == pytest.approx(7.2 / 7.0)
    # our job's metric, when no app declared one
    job = features(Evidence({}, {"eval/loss": [(80, 1.2)], **SCAN}, {}, []))
    assert job["eval_over_heldout"].value == pytest.approx(1.0)
    assert triage(Evidence({}, {"eval/loss": [(80, 1.2)], **SCAN}, {}, [])).findings == []


@pytest.mark.parametrize("bug, found", [(False, False), (True, True)])
def test_an_ema_run_away_from_the_weights_is_found_and_a_lagging_one_is_not(tmp_path, bug, found):
    store = Store(f"sqlite:///{tmp_path}/mlflow.db", "ema")
    app = HydraApp.load("bench.corpus.apps.loop.train:main")
    overrides = ["train.ema=0.99", f"bug.ema_update_sign_flipped={str(bug).lower()}"]
    state = record_baseline(store, "ema", overrides, 1, "eval loss", app=app)
    _, document = diagnose(store.uri, state.baseline["seed_runs"][0], store.experiment)
    ids = [finding["id"] for finding in document["findings"]]
    # the EMA's own read (its update moves away from the weights) names it first, the held-out
    # read second; a healthy EMA raises neither
    assert (ids[:2] == ["ema_update_wrong", "eval_reads_other_weights"]) is found, ids
    assert found or not {"ema_update_wrong", "eval_reads_other_weights"} & set(ids), ids


def test_a_metric_far_below_what_the_weights_read_is_a_wrong_normaliser_and_smoothing_is_not():
    def found(metric_end: float) -> list[str]:
        tags = {METRIC_TAG: json.dumps({"name": "eval_loss", "direction": "min"})}
        series = {"eval_loss": [(80, metric_end)], **SCAN}
        return [f.id for f in triage(Evidence({}, series, tags, [])).findings]

    assert found(1.2 / 16) == ["eval_loss_wrong_normaliser"]  # divided by a batch's 16 rows
    assert found(0.72 * 1.2) == []  # label smoothing 0.1 in the loss the weights read


@pytest.mark.parametrize("bug", [False, True])
def test_an_eval_loss_divided_by_the_rows_is_found_through_the_loop(tmp_path, bug):
    store = Store(f"sqlite:///{tmp_path}/mlflow.db", "normaliser")
    app = HydraApp.load("bench.corpus.apps.loop.train:main")
    overrides = [f"bug.eval_loss_over_dataset_size={str(bug).lower()}"]  # pytorch/tutorials#1486
    state = record_baseline(store, "normaliser", overrides, 1, "eval loss", app=app)
    _, document = diagnose(store.uri, state.baseline["seed_runs"][0], store.experiment)
    ids = [finding["id"] for finding in document["findings"]]
    assert ("eval_loss_wrong_normaliser" in ids[:1]) is bug, ids
