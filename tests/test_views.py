"""The comparison view's charts fit the investigation's curves, draw every side, and keep the x
axis hyprun's: what MLflow's saved views let a client set (README "In the MLflow UI").

No training: the seed runs are made as the controller makes them (`Store.child` with the
baseline's and a test's tags) and given losses between 4.4 and 5.5, as the demo's are."""

from __future__ import annotations

import json

import pytest

from hyprun.runner.control.verdicts import arm_name
from hyprun.runner.store.investigation import (
    ARM,
    INVESTIGATION,
    MARGIN,
    ROLE,
    Store,
    save_views,
    view_keys,
)

LOSSES = {"baseline": [5.5, 4.9, 4.4], "H1 rejected": [5.5, 5.3, 5.2]}


@pytest.fixture
def store(workdir) -> Store:
    return Store(f"sqlite:///{workdir}/mlflow.db", "hyprun")


def investigation(store: Store) -> str:
    """A baseline of two seeds and one rejected test of one seed, their eval/loss in LOSSES."""
    parent = store.create("inv", "views")
    mine = {INVESTIGATION: "inv"}
    seeds = [
        store.child(
            parent, f"baseline · seed {seed}", {**mine, ARM: "baseline", "hyprun.seed": str(seed)}
        )
        for seed in (0, 1)
    ]
    test = store.child(parent, "H1", {**mine, ROLE: "test", "hyprun.number": "1"})
    store.tag(test, {"hyprun.verdict": "rejected"})
    seeds.append(store.child(test, "H1 · seed 0", {**mine, ARM: "H1 rejected", "hyprun.seed": "0"}))
    sides = (LOSSES["baseline"], LOSSES["baseline"], LOSSES["H1 rejected"])
    for run, losses in zip(seeds, sides, strict=True):
        for step, loss in enumerate(losses):
            store.metrics(run, {"eval/loss": loss, "train/loss": loss + 0.1}, step=step * 16384)
    baseline = {
        "overrides": [],
        "seeds": 2,
        "config_hash": "h",
        "git_sha": "g",
        "seed_runs": seeds[:2],
    }
    store.tag(parent, {"hyprun.baseline": json.dumps(baseline)})
    return parent


def compare_view(store: Store, parent: str) -> dict:
    tags = store.client.get_experiment(store.run(parent).info.experiment_id).tags
    envelope = json.loads(tags["mlflow.sharedViewState." + view_keys("inv")[1]])
    return json.loads(envelope["state"])


def test_the_charts_fit_the_curves_and_draw_every_side(store):
    parent = investigation(store)
    save_views(store, store.find("inv"))
    view = compare_view(store, parent)
    charts = {c["metricKey"]: c for c in view["compareRunCharts"]}
    low, high = 4.4, 5.5  # every seed curve, the test's too
    assert charts["eval/loss"]["range"] == pytest.approx(
        {"yMin": low - MARGIN * (high - low), "yMax": high + MARGIN * (high - low)}
    )  # MLflow's own range starts at 0 (the seed band fills down to it)
    assert charts["train/loss"]["range"]["yMin"] == pytest.approx(4.5 - MARGIN * 1.1)
    assert charts["grad/norm"]["range"] == {}  # not logged: MLflow's own range
    assert all(c["xAxisKey"] == "step" and not c["useGlobalXaxisKey"] for c in charts.values())
    assert view["runsHiddenMode"] == "SHOW_ALL"  # MLflow's default draws the first 10 rows
    section = view["compareRunSections"][0]
    assert section["columns"] == 1 and section["cardHeight"] > 360  # room for the legend


def test_a_sides_legend_name_is_short():
    verdict = {"status": "rejected"}
    assert arm_name("H12 optim.lr 0.001→0.0001", verdict) == "H12 rejected"
