"""A card that would change nothing, or undo a higher-ranked cause's card, is never suggested."""

from __future__ import annotations

from rich.console import Console

from hyprun.hypotheses.applies import directions, reversed_key, unchanged_by
from hyprun.hypotheses.schema import load_cards
from hyprun.runner.control.diagnose import (
    drop_noop_cards,
    drop_reversing_cards,
    render_findings,
)

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


def test_a_relative_change_of_zero_changes_nothing():
    no_decay = {"optim": {"weight_decay": 0.0}}
    assert unchanged_by(CARDS["weight_decay_up"], no_decay) == (
        "optim.weight_decay is 0, and *3 of 0 is still 0"
    )
    assert unchanged_by(CARDS["weight_decay_up"], {"optim": {"weight_decay": 0.1}}) is None


def test_the_way_a_card_moves_a_key():
    assert directions(CARDS["lr_up_10x"]) == {"optim.lr": 1}
    assert directions(CARDS["lr_down_10x"]) == {"optim.lr": -1}
    assert directions(CARDS["pre_norm"]) == {}  # a plain value has no direction
    assert reversed_key(CARDS["lr_up_10x"], CARDS["lr_down_10x"]) == "optim.lr"
    assert reversed_key(CARDS["lr_up_10x"], CARDS["lr_up_10x"]) is None
    assert reversed_key(CARDS["lr_up_10x"], CARDS["weight_decay_up"]) is None


def finding(id_: str, cards: list[str], symptom: bool) -> dict:
    return {"id": id_, "cards": list(cards), "symptom": symptom}


def test_a_symptom_does_not_undo_a_cause_ranked_above_it():
    """The recurring strike of the apps' held-out draws 8 and 9: an LR 59-110x too high read
    as lr_too_high_config, and the flat loss it left proposed lr_up_10x after lr_down_10x."""
    findings = [
        finding("lr_too_high_config", ["lr_down_10x"], symptom=False),
        finding("loss_flat", ["lr_up_10x", "warmup"], symptom=True),
    ]
    findings[1]["deltas"] = {"lr_up_10x": ["lr=*10"], "warmup": ["warmup=0.1"]}
    drop_reversing_cards(findings)
    assert findings[0]["cards"] == ["lr_down_10x"]
    assert findings[1]["cards"] == ["warmup"]
    assert findings[1]["deltas"] == {"warmup": ["warmup=0.1"]}
    (dropped,) = findings[1]["cards_not_suggested"]
    assert dropped["card"] == "lr_up_10x"
    assert "optim.lr the other way from lr_down_10x" in dropped["reason"]


def test_a_symptom_alone_or_a_second_cause_keeps_its_cards():
    alone = [finding("loss_flat", ["lr_up_10x"], symptom=True)]
    drop_reversing_cards(alone)
    assert alone[0]["cards"] == ["lr_up_10x"]
    # Two causes that disagree are both tested: the verdicts decide between them.
    causes = [
        finding("lr_too_high_config", ["lr_down_10x"], symptom=False),
        finding("steps_too_short", ["lr_up_10x"], symptom=False),
    ]
    drop_reversing_cards(causes)
    assert causes[1]["cards"] == ["lr_up_10x"]


def test_the_findings_table_says_which_card_was_left_out_and_why():
    findings = [
        finding("lr_too_high_config", ["lr_down_10x"], symptom=False),
        finding("loss_flat", ["lr_up_10x"], symptom=True),
    ]
    drop_reversing_cards(findings)
    for row in findings:
        row |= {"group": "optimizer", "question": "Q1", "evidence": row["id"], "details": []}
        row |= {"numbers": {}, "severity": 1.0, "cause": "", "first_action": ""}
    console = Console(record=True, width=400)
    render_findings(console, findings)
    assert "not suggested: lr_up_10x: moves optim.lr the other way" in console.export_text()
