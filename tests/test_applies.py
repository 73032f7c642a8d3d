"""A card that would change nothing in the config is never suggested."""

from __future__ import annotations

from hyprun.hypotheses.applies import unchanged_by
from hyprun.hypotheses.schema import load_cards
from hyprun.runner.control.diagnose import drop_noop_cards

CARDS = load_cards()
CONFIG = {
    "model": {"placement": "pre", "init_std": 0.02, "n_layer": 2},
    "optim": {"lr": 1e-3},
    "ds": {"grad_clip": 1.0, "precision": "fp32"},
    "sched": {"warmup_frac": 0.0},
    "data": {"source": {"dedup": False}},
}


def test_a_card_setting_the_current_value_changes_nothing():
    assert unchanged_by(CARDS["pre_norm"], CONFIG) == "model.placement is already 'pre'"
    assert unchanged_by(CARDS["pre_norm"], {"model": {"placement": "post"}}) is None
    assert unchanged_by(CARDS["lr_down_10x"], CONFIG) is None  # *0.1 changes any LR
    assert unchanged_by(CARDS["dedup"], CONFIG) is None
    assert unchanged_by(CARDS["dedup"], {"data": {"source": {"dedup": True}}}) is not None
    assert unchanged_by(CARDS["pre_norm"], {"model": {}}) is None  # absent: cannot tell


def test_noop_cards_are_dropped_from_findings_with_the_reason():
    findings = [{"id": "residual_write_overwhelms", "cards": ["pre_norm", "init_std_gpt2"]}]
    drop_noop_cards(findings, CONFIG)
    assert "pre_norm" not in findings[0]["cards"]
    assert findings[0]["cards_not_suggested"][0]["card"] == "pre_norm"
