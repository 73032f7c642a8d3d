"""The real-world corpus (bench/corpus): every row is well-formed and sourced, each bug is one
switch of its app that changes training, the split is frozen once drawn, a later score of the
held-out rows takes a new data seed, and the harness refuses to score the held-out half twice.
The harness itself runs outside CI: python -m bench.corpus --set tuning|heldout."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from bench.corpus import split as split_module
from bench.corpus.__main__ import main as harness
from bench.corpus.cards import applicable
from bench.corpus.compose import app_config, final_eval_loss
from bench.corpus.schema import CORPUS, Row, all_rows, load_corpus, load_later
from bench.corpus.split import SPLIT, draw, load_split, sha256
from bench.frozen import ROOT

ROWS = load_corpus().rows
EVERY_ROW = all_rows()
TINY = ["train.steps=8", "train.eval_every=4", "data.n_train=64", "model.d_model=16"]
"""A run of a few seconds' fraction: 4 optimizer steps per epoch, so per-epoch switches act."""
FULL: list[str] = []
"""The run as the row's harm was measured: for switches that act only past TINY's scale (a
filter that keeps under one batch of its 64 rows, a clip its small gradients never reach, a
schedule's change late in the run)."""


def test_at_least_fifteen_rows_each_with_a_public_source():
    assert len(ROWS) >= 15
    for row in EVERY_ROW:
        assert row.sources and all(url.startswith("https://") for url in row.sources), row.id
        assert row.saw.strip() and row.root_cause.strip() and row.cause, row.id


def test_a_switch_must_be_one_bug_key():
    fields = ROWS[0].model_dump()
    for bad in ("bug.a=true", "optim.lr", "bug.a.b", "bug.a bug.b"):
        with pytest.raises(ValueError, match="one key"):
            Row(**{**fields, "switch": bad})


@pytest.mark.parametrize("row", EVERY_ROW, ids=[row.id for row in EVERY_ROW])
def test_each_switch_is_off_in_the_twin_and_changes_training(row):
    twin = app_config(row.form, row.twin_overrides)
    assert OmegaConf.select(twin, row.switch) is False  # all off: the clean twin
    assert OmegaConf.select(app_config(row.form, row.fault_overrides), row.switch) is True
    assert changes_training(row, TINY) or changes_training(row, FULL), row.id


def changes_training(row: Row, scale: list[str]) -> bool:
    """Whether the fault's run ends at another held-out loss than its twin's at `scale`; False
    where the fault leaves less than one batch to train on there."""
    try:
        fault_loss = final_eval_loss(row.form, [*scale, *row.fault_overrides], seed=0)
    except ValueError as error:
        if "fewer than one batch" in str(error):
            return False
        raise
    twin_loss = final_eval_loss(row.form, [*scale, *row.twin_overrides], seed=0)
    return fault_loss != pytest.approx(twin_loss, rel=1e-6, abs=1e-7)


def test_fix_cards_are_cards_that_apply_to_the_fault():
    for row in EVERY_ROW:
        assert set(row.fix_cards) <= set(applicable(row.form, row.fault_overrides)), row.id


def test_cards_translate_through_the_apps_knobs():
    cards = applicable("loop", ["optim.lr=0.002"])
    assert cards["lr_down_10x"] == ["optim.lr=0.0002"]
    assert "grad_clip" not in cards  # clipping is already 1.0: the card changes nothing


def test_the_split_is_the_seeded_draw_of_the_rows_as_they_stand():
    split = load_split()
    ids = [row.id for row in ROWS]
    assert draw(ids, split["seed"]) == {"tuning": split["tuning"], "heldout": split["heldout"]}
    assert sorted(split["tuning"] + split["heldout"]) == sorted(ids)
    assert split["corpus_sha256"] == sha256(CORPUS), "corpus.yaml changed after the split"


def test_results_were_scored_on_this_split():
    for path in sorted(SPLIT.parent.glob("results/*.json")):
        meta = json.loads(path.read_text()).get("meta")
        if meta and "split_sha256" in meta:
            scored = ROOT / meta["draw"]["split"] if meta.get("draw") else SPLIT  # a later draw
            assert meta["split_sha256"] == sha256(scored), f"{scored} changed after {path.name}"


def test_a_later_score_takes_the_held_out_rows_on_a_new_data_seed(tmp_path, monkeypatch):
    monkeypatch.setattr(split_module, "DRAWS", tmp_path)  # not the repository's draws/
    assert split_module.main(["--redraw", "3", "--why", "test"]) == 0
    assert split_module.main(["--redraw", "3"]) == 2  # made once
    later = load_split(tmp_path / "3.yaml")
    assert later["heldout"] == load_split()["heldout"] and later["data_seed"] >= 2
    assert later["corpus_sha256"] == sha256(CORPUS) and later["why"] == "test"


def test_rows_found_after_the_split_are_drawn_once_and_frozen_by_their_draw(
    tmp_path, monkeypatch, capsys
):
    later = [row.id for row in load_later()]
    batch_of = {row.id: row.batch for row in load_later()}
    for path in sorted(split_module.DRAWS.glob("*.yaml")):
        drawn = load_split(path)
        if "later_sha256" in drawn:  # a later batch may be appended; a drawn one stands
            batches = {batch_of[row] for row in drawn["heldout"]}
            assert drawn["heldout"] == [row for row in later if batch_of[row] in batches]
            digest = split_module.rows_sha256(drawn["heldout"])
            frozen = split_module.drawn_rows_sha256(drawn)
            assert frozen == digest, f"rows of {path.name} changed after it"
    monkeypatch.setattr(split_module, "DRAWS", tmp_path)
    if later:
        assert split_module.main(["--later", "4"]) == 0
        assert load_split(tmp_path / "4.yaml")["heldout"] == later
        last = max(batch_of.values())
        assert split_module.main(["--later", "6", "--batch", str(last)]) == 0
        one_batch = load_split(tmp_path / "6.yaml")
        assert one_batch["heldout"] == [row for row in later if batch_of[row] == last]
        assert one_batch["batch"] == last
    monkeypatch.setattr(split_module, "load_later", lambda: [])
    assert split_module.main(["--later", "5"]) == 2
    assert "later.yaml" in capsys.readouterr().err and not (tmp_path / "5.yaml").exists()


def test_the_held_out_half_is_scored_once(tmp_path, capsys):
    (tmp_path / "heldout.json").write_text("{}")
    assert harness(["--set", "heldout", "--out", str(tmp_path)]) == 2
    assert "scored once" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heldout.json"]


def test_the_invariant_hooks_are_quiet_on_the_twin_and_name_a_planted_bug():
    from bench.corpus.invariant_rates import fired

    short = ["train.steps=24", "train.eval_every=8", "data.n_train=128"]
    assert fired(short, seed=0) == {}
    assert set(fired([*short, "bug.zero_grad_per_epoch=true"], seed=0)) == {
        "grads_reset_between_steps"
    }
    assert set(fired([*short, "bug.head_not_in_optimizer=true"], seed=0)) >= {
        "every_trainable_param_is_optimized"
    }


def probe_statuses(overrides: list[str]) -> dict[str, str]:
    """The probe's L0 check statuses on a short run of the corpus loop."""
    from bench.corpus.apps.loop.train import fit
    from bench.corpus.invariant_rates import Recorder
    from hyprun.diag.live_checks import read_l0_tags

    recorder = Recorder()
    short = ["train.steps=8", "train.eval_every=8", "data.n_train=128", "seed=0"]
    fit(app_config("loop", [*short, *overrides]), probe=True, tracker=recorder)
    return {c["id"]: c["status"] for c in read_l0_tags(recorder.tags)}


ACCUMULATED = ["train.accum=4", "train.batch=4"]
CHECKS = (
    "labels_misaligned",
    "accumulation_loss_scale",
    "clip_ineffective",
    "repeated_batch",
    "loss_on_padding",
)


@pytest.mark.parametrize(
    ("overrides", "statuses"),
    [
        ([], ("pass", "skip", "pass", "pass", "pass")),
        (["optim.clip=0"], ("pass", "skip", "skip", "pass", "pass")),
        (["bug.labels_not_shifted=true"], ("fail", "skip", "pass", "pass", "skip")),
        (["bug.labels_shifted_twice=true"], ("fail", "skip", "pass", "pass", "skip")),
        (["bug.padding_in_loss=true", "data.min_len=2"], ("pass", "skip", "pass", "pass", "fail")),
        (ACCUMULATED, ("pass",) * 5),
        (
            [*ACCUMULATED, "bug.accum_loss_not_divided=true"],
            ("pass", "fail", "pass", "pass", "pass"),
        ),
        ([*ACCUMULATED, "bug.accum_mean_of_means=true", "data.min_len=2"], ("pass",) * 5),
        (["bug.clip_after_step=true", "optim.clip=0.25"], ("pass", "skip", "fail", "pass", "pass")),
        (["bug.same_batch_every_step=true"], ("pass", "skip", "pass", "fail", "pass")),
        (["bug.data_not_shuffled=true"], ("pass", "skip", "pass", "pass", "pass")),
    ],
)
def test_the_probe_reads_targets_loss_scale_clipping_and_batches_as_the_loop_wrote_them(
    overrides, statuses
):
    """Targets equal to the inputs (not shifted) or two on (shifted twice) break next-token
    prediction; padding as a target does not move the offset, and the loop names its pad id
    (its forward gets no attention mask), so padding counted as a target is read off the ids.
    A micro-batch mean summed over 4 micro-batches weighs the step's tokens 4; a mean of means
    keeps the total weight 1 (its harm is the weighting between micro-batches, which this check
    does not read). Clipping
    after optimizer.step() leaves the step's gradients above the threshold; with no threshold
    declared there is nothing to hold the step to. A fresh iterator each step trains on one
    batch again and again; a loader that does not shuffle still draws a new batch each step."""
    found = probe_statuses(overrides)
    assert tuple(found[check] for check in CHECKS) == statuses, found


def test_harm_measures_a_row_found_after_the_split(tmp_path, monkeypatch):
    """A later batch is built blind with the same tool: fault against twin, no probe."""
    from bench.corpus import harm

    monkeypatch.setattr(harm, "RESULTS", tmp_path)
    monkeypatch.setattr(harm, "SEEDS", (0,))
    measured = harm.measure(["attention_mask_inverted"])["attention_mask_inverted"]
    assert measured["change"] < -0.5  # each position reads the tokens after it: a leak
    assert "cards" not in measured  # silent: its harm is not a worse loss, no card screen
