"""The optimizer steps as often as the run declares (diag/features.py forwards_per_declared_step,
the finding optimizer_steps_skipped): the probe reads the training forwards of each of the first
optimizer steps, the app's launcher records the micro-batches per step its ds.grad_accum knob
declares. Through a real baseline of the corpus's plain-loop app: step() under the epoch loop
(XinyiYS/Gradient-Driven-Rewards-to-Guarantee-Fairness-in-Collaborative-Machine-Learning#3) is
found; declared accumulation, an undeclared one and our job's config are read as such."""

from __future__ import annotations

from hyprun.diag.evidence import Evidence
from hyprun.diag.features import ACCUMULATION_TAG, features
from hyprun.diag.triage import triage
from hyprun.runner.control.baseline import record_baseline
from hyprun.runner.control.diagnose import diagnose
from hyprun.runner.launch.app import HydraApp
from hyprun.runner.store.investigation import Store


def read(forwards: int, tags: dict, config: dict | None = None) -> float | None:
    static = [{"id": "step_forwards", "status": "pass", "value": forwards}]
    found = features(Evidence(config or {}, {}, tags, static)).get("forwards_per_declared_step")
    return found.value if found else None


def test_forwards_are_held_against_the_declared_accumulation():
    assert read(4, {ACCUMULATION_TAG: "4"}) == 1.0  # accumulation as declared
    assert read(4, {ACCUMULATION_TAG: "unknown"}) is None  # no knob maps it: not judged
    assert read(8, {}, {"ds": {"grad_accum": 2}}) == 4.0  # our job's config
    static = [{"id": "step_forwards", "status": "pass", "value": 2}]
    twice = Evidence({}, {}, {ACCUMULATION_TAG: "1"}, static)  # SAM, R-drop: two passes
    assert "optimizer_steps_skipped" not in [f.id for f in triage(twice).findings]


def test_an_optimizer_stepped_once_per_epoch_is_found(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/mlflow.db", "cadence")
    app = HydraApp.load("bench.corpus.apps.loop.train:main")
    state = record_baseline(
        store, "cadence", ["bug.optimizer_step_per_epoch=true"], 1, "plateau", app=app
    )
    _, document = diagnose(store.uri, state.baseline["seed_runs"][0], store.experiment)
    found = {finding["id"]: finding for finding in document["findings"]}
    assert "optimizer_steps_skipped" in found, list(found)
    assert "128x the declared micro-batches" in found["optimizer_steps_skipped"]["evidence"]
