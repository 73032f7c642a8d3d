"""Hypothesis cards: the shipped cards are valid, runnable one-variable deltas wired to the
triage tables, and the loader refuses malformed or hostile files with one-line errors."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from hyprun.diag.metric import MetricSpec
from hyprun.diag.triage import TABLES_DIR, load_tables
from hyprun.hypotheses import schema
from hyprun.hypotheses.schema import (
    CARDS_DIR,
    MAX_BYTES,
    Card,
    cards_for,
    load_card,
    load_cards,
    override_key,
)
from hyprun.runner.compose import compose
from hyprun.runner.errors import BadInput

CARDS = load_cards()
PATTERNS = load_tables(TABLES_DIR)
PATTERN_IDS = {p.id for p in PATTERNS}


@pytest.fixture(scope="module")
def baseline() -> DictConfig:
    return compose([])


def absolute(delta: tuple[str, ...], base: DictConfig) -> list[str]:
    """The delta with every `*F` value replaced by the baseline's value times F."""
    out = []
    for override in delta:
        key, _, value = override.partition("=")
        if value.startswith("*"):
            current = OmegaConf.select(base, override_key(override))
            assert isinstance(current, (int, float)) and not isinstance(current, bool), override
            scaled = current * float(value[1:])
            if isinstance(current, int) and float(scaled).is_integer():
                scaled = int(scaled)
            override = f"{key}={scaled!r}"
        out.append(override)
    return out


def changed(a: Any, b: Any, prefix: str = "") -> set[str]:
    """Dotted keys of the leaves that differ between two config trees (lists are leaves); a
    subtree that exists on one side only counts by its leaves."""
    if a is None and isinstance(b, dict):
        a = {}
    if b is None and isinstance(a, dict):
        b = {}
    if isinstance(a, dict) and isinstance(b, dict):
        keys: set[str] = set()
        for k in set(a) | set(b):
            keys |= changed(a.get(k), b.get(k), f"{prefix}{k}.")
        return keys
    return set() if a == b else {prefix[:-1]}


# --- the shipped cards ---------------------------------------------------------------------


def test_shipped_cards_load():
    files = sorted(CARDS_DIR.glob("*.yaml"))
    assert len(CARDS) == len(files) >= 30
    for path in files:
        assert CARDS[path.stem].id == path.stem
        assert CARDS[path.stem].path == path


@pytest.mark.parametrize("card_id", sorted(CARDS))
def test_delta_composes_and_changes_one_variable(card_id: str, baseline: DictConfig):
    card = CARDS[card_id]
    overrides = absolute(card.delta, baseline)
    cfg = compose(overrides)
    before = OmegaConf.to_container(baseline, resolve=False)
    after = OmegaConf.to_container(cfg, resolve=False)
    var = card.variable
    stray = {k for k in changed(before, after) if k != var and not k.startswith(var + ".")}
    assert not stray, f"{card_id}: {overrides} also changes {sorted(stray)}"
    if var.startswith("model."):  # the built-in GPT accepts the new value
        instantiate(cfg.model)


@pytest.mark.parametrize("card_id", sorted(CARDS))
def test_delta_names_exactly_one_key(card_id: str):
    card = CARDS[card_id]
    assert card.delta
    assert len({d.partition("=")[0].lstrip("+") for d in card.delta}) == 1


def test_primary_and_guards_follow_the_question():
    for card in CARDS.values():
        if card.question in ("Q1", "Q2"):
            assert card.primary == MetricSpec("eval/loss", "min", card.primary.min_effect), card.id
        else:
            assert card.primary.metric in (
                "perf/tokens_per_s",
                "perf/data_wait_frac",
                "perf/peak_mem_gb",
            ), card.id
            assert any(g.metric == "eval/loss" for g in card.guards), card.id
        assert card.primary.min_effect > 0, card.id
        assert card.primary.metric not in {g.metric for g in card.guards}, card.id


def test_triggers_are_table_patterns():
    for card in CARDS.values():
        unknown = set(card.triggers) - PATTERN_IDS
        assert not unknown, f"{card.id}: triggers name no table row: {sorted(unknown)}"


def test_table_cards_exist_and_trigger_back():
    for pattern in PATTERNS:
        for card_id in pattern.cards:
            assert card_id in CARDS, f"{pattern.source}: {pattern.id} names missing card {card_id}"
            assert pattern.id in CARDS[card_id].triggers, f"{card_id} lacks trigger {pattern.id}"


REPORT_DELTAS = [
    "sched=cosine_warm_restarts",
    "optim.betas=[0.9,0.95]",
    "optim.weight_decay=0.1",
    "ds.grad_accum=*4",
    "data.source.dedup=true",
    "data.loader.trim_padding=true",
    "data.loader.num_workers=2",
    "data.loader.prefetch_factor=4",
    "ds.loss_scale=0",
    "ds.precision=bf16",
    "ds.grad_clip=1.0",
    "model.norm=rmsnorm",
    "model.mlp=swiglu",
    "model.pos=rope",
    "model.activation_checkpointing=true",
    "ds.zero_stage=2",
]


@pytest.mark.parametrize("delta", REPORT_DELTAS)
def test_every_report_recommendation_has_a_card_with_its_claim(delta: str):
    matching = [c for c in CARDS.values() if c.delta == (delta,)]
    assert matching, f"no card for the report's {delta}"
    assert any(c.claimed and c.claimed.source == "classic plateau report" for c in matching)


def test_method_first_actions_have_cards():
    wanted = {
        "lr_down_10x": "optim.lr=*0.1",
        "lr_up_10x": "optim.lr=*10",
        "warmup": "sched.warmup_frac=0.05",
        "init_std_gpt2": "model.init_std=0.02",
        "pre_norm": "model.placement=pre",
        "moe_aux_loss": "model.moe_aux_weight=0.01",
    }
    assert {k: CARDS[k].delta for k in wanted} == {k: (v,) for k, v in wanted.items()}


def test_prefetch_card_says_it_needs_workers():
    assert "num_workers > 0" in (CARDS["prefetch"].notes or "")


# --- cards_for -----------------------------------------------------------------------------


def _card(card_id: str, *triggers: str) -> Card:
    return Card(
        id=card_id,
        title=card_id,
        question="Q1",
        statement="I think x because y",
        delta=("optim.lr=*0.1",),
        primary=MetricSpec("eval/loss", "min", 0.01),
        triggers=triggers,
    )


def test_cards_for_follows_the_findings_order():
    pool = {c.id: c for c in (_card("a", "f2"), _card("b", "f1", "f2"), _card("c", "f3"))}
    assert [c.id for c in cards_for(["f1", "f2"], pool)] == ["b", "a"]
    assert [c.id for c in cards_for(["f2", "f1"], pool)] == ["a", "b"]
    assert [c.id for c in cards_for(["f3", "nope", "f1"], pool.values())] == ["c", "b"]
    assert cards_for([], pool) == [] and cards_for(["nope"], pool) == []


def test_cards_for_shipped_findings():
    assert {c.id for c in cards_for(["input_bound"], CARDS)} == {"loader_workers", "prefetch"}
    first = cards_for(["memory_over", "input_bound"], CARDS)
    assert {c.id for c in first[:3]} == {
        "zero_stage",
        "activation_checkpointing",
        "micro_batch_down",
    }


# --- validation ----------------------------------------------------------------------------

VALID = """\
id: my_card
title: A card
question: Q1
statement: I think the LR is too high because the loss oscillates
delta: ["optim.lr=*0.1"]
primary: {metric: eval/loss, direction: min, min_effect: 0.01}
guards:
  - {metric: perf/tokens_per_s, direction: max}
triggers: [lr_too_high_oscillation]
claimed: {source: a report, effect: 25% faster, confidence: "85%"}
notes: free text
"""


def write(tmp_path: Path, text: str, name: str = "my_card") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def refused(path: Path, *expected: str) -> str:
    with pytest.raises(ValueError) as info:
        load_card(path)
    message = str(info.value)
    assert "\n" not in message, message
    assert str(path) in message, message
    for part in expected:
        assert part in message, message
    return message


def test_valid_card_loads(tmp_path: Path):
    card = load_card(write(tmp_path, VALID))
    assert card.id == "my_card" and card.delta == ("optim.lr=*0.1",)
    assert card.primary == MetricSpec("eval/loss", "min", 0.01)
    assert card.guards == (MetricSpec("perf/tokens_per_s", "max", 0.0),)
    assert card.claimed is not None and card.claimed.confidence == "85%"
    assert card.variable == "optim.lr"


def test_optional_fields_may_be_left_out(tmp_path: Path):
    text = "\n".join(
        line
        for line in VALID.splitlines()
        if not line.startswith(("guards", "  -", "triggers", "claimed", "notes"))
    )
    card = load_card(write(tmp_path, text))
    assert card.guards == () and card.triggers == () and card.claimed is None and card.notes is None


BAD = [
    ("unknown field", "notes: free text", "notes: x\ncolour: red", ["unknown key 'colour'"]),
    ("missing field", 'delta: ["optim.lr=*0.1"]\n', "", ["missing field 'delta'"]),
    (
        "title not a string",
        "title: A card",
        "title: [a, b]",
        ["title: Input should be a valid string"],
    ),
    (
        "title a number",
        "title: A card",
        "title: 3",
        ["title: Input should be a valid string, got 3"],
    ),
    ("statement form", "statement: I think", "statement: the LR is high", ["statement: must"]),
    ("id is not stem", "id: my_card", "id: other_card", ["id: 'other_card'", "file stem"]),
    ("id pattern", "id: my_card", "id: My-Card", ["id: String should match pattern", "'My-Card'"]),
    (
        "bad question",
        "question: Q1",
        "question: Q4",
        ["question: Input should be 'Q1', 'Q2' or 'Q3'"],
    ),
    (
        "bad direction",
        "direction: min,",
        "direction: down,",
        ["primary: direction: Input should be 'min' or 'max'"],
    ),
    (
        "guard direction",
        "direction: max}",
        "direction: up}",
        ["guards: item 0: direction: Input should be"],
    ),
    (
        "negative effect",
        "min_effect: 0.01",
        "min_effect: -0.1",
        ["primary: min_effect: Input should be"],
    ),
    ("nan effect", "min_effect: 0.01", "min_effect: .nan", ["primary: min_effect:", "finite"]),
    ("inf effect", "min_effect: 0.01", "min_effect: .inf", ["primary: min_effect:", "finite"]),
    ("string effect", "min_effect: 0.01", "min_effect: 1e-2", ["min_effect:", "1.0e-2"]),
    (
        "word effect",
        "min_effect: 0.01",
        "min_effect: big",
        ["min_effect: Input should be a valid number"],
    ),
    (
        "bool effect",
        "min_effect: 0.01",
        "min_effect: true",
        ["primary: min_effect: Input should be"],
    ),
    ("missing effect", ", min_effect: 0.01}", "}", ["primary: missing field 'min_effect'"]),
    (
        "primary not mapping",
        "{metric: eval/loss, direction: min, min_effect: 0.01}",
        "eval/loss",
        ["primary: Input should be a valid dictionary"],
    ),
    ("empty delta", '["optim.lr=*0.1"]', "[]", ["delta: is empty"]),
    (
        "delta not a list",
        '["optim.lr=*0.1"]',
        '"optim.lr=*0.1"',
        ["delta: Input should be a valid tuple"],
    ),
    ("delta not strings", '["optim.lr=*0.1"]', "[3]", ["delta.0: Input should be a valid string"]),
    ("delta not key=value", '["optim.lr=*0.1"]', '["optim.lr"]', ["delta:", "key=value"]),
    ("delta deletion", '["optim.lr=*0.1"]', '["~optim.lr"]', ["delta:", "key=value"]),
    ("delta empty value", '["optim.lr=*0.1"]', '["optim.lr="]', ["delta:", "key=value"]),
    ("two variables", '["optim.lr=*0.1"]', '["optim.lr=*0.1", "sched=wsd"]', ["delta: sets 2"]),
    ("bad factor", '["optim.lr=*0.1"]', '["optim.lr=*ten"]', ["delta:", "factor F > 0"]),
    ("zero factor", '["optim.lr=*0.1"]', '["optim.lr=*0"]', ["delta:", "factor F > 0"]),
    ("underscore factor", '["optim.lr=*0.1"]', '["optim.lr=*1_0"]', ["delta:", "factor F > 0"]),
    (
        "guards not list",
        "guards:\n  - {metric: perf/tokens_per_s, direction: max}",
        "guards: 3",
        ["guards: must be a list"],
    ),
    (
        "guard unknown field",
        "direction: max}",
        "direction: max, why: x}",
        ["guards: item 0: unknown key 'why'"],
    ),
    (
        "trigger not id",
        "[lr_too_high_oscillation]",
        "[Bad Id]",
        ["triggers.0: String should match pattern", "'Bad Id'"],
    ),
    (
        "triggers not list",
        "[lr_too_high_oscillation]",
        "lr_too_high",
        ["triggers: Input should be a valid tuple"],
    ),
    (
        "triggers zero",
        "[lr_too_high_oscillation]",
        "0",
        ["triggers: Input should be a valid tuple"],
    ),
    (
        "guards empty text",
        "guards:\n  - {metric: perf/tokens_per_s, direction: max}",
        "guards: ''",
        ["guards: must be a list"],
    ),
    ("claim missing", "effect: 25% faster, ", "", ["missing field 'effect' in claimed"]),
    ("claim unknown", "confidence:", "by: me, confidence:", ["unknown key 'by' in claimed"]),
    (
        "claim number",
        'confidence: "85%"',
        "confidence: 0.85",
        ["claimed.confidence: Input should be a valid string"],
    ),
    ("notes not text", "notes: free text", "notes: [a]", ["notes: Input should be a valid string"]),
    ("duplicate key", "notes: free text", "notes: a\nnotes: b", ["duplicate key 'notes'"]),
    ("yaml syntax", "notes: free text", "notes: [unclosed", ["not valid YAML"]),
]


@pytest.mark.parametrize(("old", "new", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_card_is_refused_in_one_line(tmp_path: Path, old: str, new: str, expected: list):
    assert old in VALID
    refused(write(tmp_path, VALID.replace(old, new, 1)), *expected)


def test_not_a_mapping(tmp_path: Path):
    refused(write(tmp_path, "- id: my_card\n"), "mapping")
    refused(write(tmp_path, ""), "mapping")


def test_not_utf8(tmp_path: Path):
    path = tmp_path / "my_card.yaml"
    path.write_bytes(VALID.encode() + b"\xff\xfe")
    refused(path, "UTF-8")


def test_anchor_bomb_fails_fast(tmp_path: Path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 12):  # 9**12 strings if expanded
        prev, name = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    path = write(tmp_path, VALID + "\n".join(lines) + "\n")
    start = time.perf_counter()
    refused(path, "anchors and aliases")
    assert time.perf_counter() - start < 1.0


def test_plain_alias_is_refused(tmp_path: Path):
    text = VALID.replace("title: A card", "title: &t A card")
    text = text.replace("notes: free text", "notes: *t")
    refused(write(tmp_path, text), "line 2", "anchors and aliases")


def test_oversized_file_is_refused_before_parsing(tmp_path: Path, monkeypatch):
    path = write(tmp_path, VALID + "# " + "x" * (100 * 1024) + "\n")
    assert path.stat().st_size > MAX_BYTES

    def parse(*args, **kwargs):
        raise AssertionError("parsed a file over the size limit")

    monkeypatch.setattr(schema.yaml, "load", parse)
    refused(path, "byte limit")


@pytest.mark.parametrize(
    "tagged",
    [
        '!!python/object/apply:os.system ["echo pwned > pwned.txt"]',
        "!!python/name:os.system",
        '!!python/object/new:os.system ["echo pwned"]',
        "!!str text",
    ],
)
def test_tags_are_refused_and_nothing_runs(tmp_path: Path, monkeypatch, tagged: str):
    calls: list[Any] = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a) or 0)
    monkeypatch.chdir(tmp_path)
    refused(write(tmp_path, VALID.replace("notes: free text", f"notes: {tagged}")), "tag")
    assert calls == [] and not (tmp_path / "pwned.txt").exists()


def test_deep_nesting_is_refused(tmp_path: Path):
    refused(write(tmp_path, VALID + "x: " + "[" * 5000 + "]" * 5000 + "\n"), "nested deeper")


def test_strings_stay_strings(tmp_path: Path):
    code = "__import__('os').system('echo pwned')"
    text = (
        VALID.replace("title: A card", f'title: "{code}"')
        .replace('["optim.lr=*0.1"]', '["model.norm=${oc.env:HOME}"]')
        .replace("notes: free text", 'notes: "{{ 7 * 7 }} $(id) `id`"')
    )
    card = load_card(write(tmp_path, text))
    assert card.title == code
    assert card.delta == ("model.norm=${oc.env:HOME}",)
    assert card.notes == "{{ 7 * 7 }} $(id) `id`"


def test_load_cards_reads_a_folder_and_refuses_a_bad_card(tmp_path: Path):
    write(tmp_path, VALID)
    write(tmp_path, VALID.replace("id: my_card", "id: second"), name="second")
    assert list(load_cards(tmp_path)) == ["my_card", "second"]
    write(tmp_path, VALID.replace("id: my_card", "id: third\nextra: 1"), name="third")
    with pytest.raises(ValueError, match="third.yaml: unknown key 'extra'"):
        load_cards(tmp_path)


def test_missing_file(tmp_path: Path):
    refused(tmp_path / "nope.yaml", "cannot read")


def test_not_a_regular_file(tmp_path: Path):
    fifo = tmp_path / "my_card.yaml"
    os.mkfifo(fifo)
    refused(fifo, "not a regular file")
    refused(tmp_path, "not a regular file")


@pytest.mark.parametrize("card_id", sorted(CARDS))
def test_group_switches_are_pinned_or_declared_compound(card_id: str):
    """The controller's rule on the default baseline: a card passes it as one variable, and
    declares `compound` exactly when its switch also moves keys both choices share."""
    from hyprun.runner.control.one_variable import measure

    card = CARDS[card_id]
    try:
        delta = measure([], list(card.delta), compound=bool(card.compound))
    except BadInput as refused:
        assert "changes nothing" in str(refused), refused  # the default already has it
        return
    assert bool(delta.compound) == bool(card.compound), (card_id, delta.compound)


def test_compound_needs_its_reason(tmp_path: Path):
    path = write(tmp_path, VALID + "compound: true\n")
    refused(path, "compound: Input should be a valid string")
    card = load_card(write(tmp_path, VALID + "compound: the preset as a whole\n"))
    assert card.compound == "the preset as a whole"
