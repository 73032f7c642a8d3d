"""The corpus's rows in the form they were reported in (bench/corpus/forms.yaml): every entry
names a corpus row and a switch of its app, off in the twin, that changes training; and a bug
the invariants cover fails its check through HyprunTrainerCallback while its twin passes.
The measurement itself runs outside CI: python -m bench.corpus.forms."""

from __future__ import annotations

import tempfile
from functools import cache

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from bench.corpus.compose import app_config
from bench.corpus.invariant_rates import Recorder
from bench.corpus.schema import load_corpus, load_forms

FORMS = load_forms().forms
TINY = [
    "training.max_steps=4",
    "training.eval_steps=4",
    "training.logging_steps=4",
    "data.n_train=64",
    "data.n_eval=16",
    "model.n_embd=16",
    "model.n_layer=1",
]
"""A run of a fraction of a second: enough steps for a switch to change the weights."""


@cache
def run(app: str, overrides: tuple[str, ...]) -> tuple[dict, dict]:
    """The losses of a tiny run of the app, and the checks its callback recorded (a twin that
    several forms share runs once)."""
    from bench.corpus.apps.hf.train import epoch_steps, fit
    from hyprun.diag.live_checks import read_l0_tags
    from hyprun.runner.job.callbacks import HyprunTrainerCallback

    torch.set_num_threads(1)
    cfg = app_config(app, [*TINY, *overrides, "seed=0"])
    recorder = Recorder()
    probe = HyprunTrainerCallback(every_steps=2, epoch_steps=epoch_steps(cfg), tracker=recorder)
    losses = fit(cfg, tempfile.mkdtemp(prefix="hyprun-test-forms-"), [probe], report_to=[])
    checks = {c["id"]: c["status"] for c in read_l0_tags(recorder.tags)}
    return losses, checks


def test_every_form_names_a_corpus_row_once():
    ids = {row.id for row in load_corpus().rows}
    assert {f.id for f in FORMS} <= ids
    assert {"labels_shifted_twice", "frozen_except_norm"} <= {f.id for f in FORMS if f.form == "hf"}


ENTRY = {"id": "padding_in_loss", "form": "hf", "switch": "bug.padding_in_loss"}


@pytest.mark.parametrize(
    ("entries", "refusal"),
    [
        ([{**ENTRY, "id": "not_a_row"}], "not_a_row"),
        ([{**ENTRY, "switch": "padding_in_loss"}], "one key"),
        ([ENTRY, ENTRY], "twice"),
    ],
)
def test_a_form_the_corpus_cannot_take_is_refused(tmp_path, entries, refusal):
    table = tmp_path / "forms.yaml"
    table.write_text(yaml.safe_dump({"forms": entries}))
    with pytest.raises(ValueError, match=refusal):
        load_forms(table)


@pytest.mark.parametrize("form", FORMS, ids=[f"{f.id}-{f.form}" for f in FORMS])
def test_each_switch_is_off_in_the_twin_and_changes_training(form):
    assert OmegaConf.select(app_config(form.form, form.twin_overrides), form.switch) is False
    assert OmegaConf.select(app_config(form.form, form.fault_overrides), form.switch) is True
    fault, _ = run(form.form, tuple(form.fault_overrides))
    twin, _ = run(form.form, tuple(form.twin_overrides))
    assert fault["heldout_loss"] != pytest.approx(twin["heldout_loss"], rel=1e-6, abs=1e-7)


def test_the_callback_fails_a_missing_head_and_passes_its_twin():
    form = next(f for f in FORMS if f.id == "head_not_in_optimizer")
    _, fault = run(form.form, tuple(form.fault_overrides))
    _, twin = run(form.form, tuple(form.twin_overrides))
    assert fault["optimizer_coverage"] == "fail"
    assert twin["optimizer_coverage"] == "pass"
