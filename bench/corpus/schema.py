"""The corpus table's schema: every row of corpus.yaml is validated by these models on load."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

CORPUS = Path(__file__).with_name("corpus.yaml")
LATER = Path(__file__).with_name("later.yaml")
"""Rows found after the split, in a file of their own so that the split's rows (corpus.yaml)
stay byte for byte as split: all held out, scored once (`python -m bench.corpus.split --later`)."""
FORMS = ("hf", "lightning", "loop", "ours")


class Harm(BaseModel):
    """What the planted bug did at this scale: final held-out loss, fault and clean twin."""

    model_config = ConfigDict(extra="forbid")
    fault: list[float]
    """The fault's final eval loss, one per seed (seeds 0 and 1)."""
    twin: list[float]
    """The clean twin's (switch off, same base overrides), same seeds."""
    change: float
    """Mean fault over mean twin, minus 1: +0.20 is 20% worse."""


class Row(BaseModel):
    """One publicly reported training failure, reproduced behind a switch."""

    model_config = ConfigDict(extra="forbid")
    id: str
    sources: list[str] = Field(min_length=1)
    """Where it was reported: issue, pull request or forum thread URLs."""
    reported_in: Literal["hf", "lightning", "loop", "ours", "deepspeed", "megatron"]
    """The form its reporters trained in."""
    form: Literal["hf", "lightning", "loop", "ours"]
    """The form it is reproduced in here (bench/corpus/apps/FORM)."""
    saw: str
    """What the reporters saw, in our words."""
    switch: str
    """The one config key that plants the bug (`bug.NAME`, true = bug on)."""
    base: list[str] = []
    """Overrides the fault and its clean twin share (the setting the report trained in)."""
    root_cause: str
    """The root cause in words."""
    cause: list[str] = Field(min_length=1)
    """Finding ids that name the root cause: a detection is one of them in the top 3."""
    fix_cards: list[str] = []
    """Cards (as the app spells them, apps/FORM/cards.yaml) whose one-variable test removes the
    harm; empty when only the code fix does (the switch itself, always a fix)."""
    silent: bool = False
    """True when the harm is a wrong number or a silently dropped feature rather than a worse
    eval loss at this budget (the report's own description)."""
    harm: Harm | None = None
    """Measured by `python -m bench.corpus.harm` before the split; null until then."""
    batch: int = Field(default=1, ge=1)
    """later.yaml: which search after the split found the row (1 the first). A batch is scored
    clean once, with diag/ frozen before its rows were added (`split --later SEED --batch N`)."""

    @field_validator("sources")
    @classmethod
    def _urls(cls, sources: list[str]) -> list[str]:
        for url in sources:
            if not url.startswith("https://"):
                raise ValueError(f"source {url!r} is not an https URL")
        return sources

    @field_validator("switch")
    @classmethod
    def _one_key(cls, switch: str) -> str:
        if (
            not switch.startswith("bug.")
            or "=" in switch
            or " " in switch
            or switch.count(".") != 1
        ):
            raise ValueError(f"switch {switch!r} must be one key bug.NAME")
        return switch

    @property
    def fault_overrides(self) -> list[str]:
        return [*self.base, f"{self.switch}=true"]

    @property
    def twin_overrides(self) -> list[str]:
        return list(self.base)


def unique_ids(rows: list[Row]) -> list[Row]:
    ids = [row.id for row in rows]
    if len(ids) != len(set(ids)):
        raise ValueError("row ids repeat")
    return rows


class Corpus(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: list[Row] = Field(min_length=15)

    @field_validator("rows")
    @classmethod
    def _unique(cls, rows: list[Row]) -> list[Row]:
        return unique_ids(rows)


def load_corpus(path: Path = CORPUS) -> Corpus:
    return Corpus.model_validate(yaml.safe_load(Path(path).read_text()))


class Later(Corpus):
    """Rows found after the split (later.yaml): held out as a whole, none of them tuned on."""

    rows: list[Row] = Field(min_length=1)


def load_later(path: Path = LATER) -> list[Row]:
    """The later rows; none when the file is not there. An id the split already holds is
    refused: a row is scored in one set only."""
    if not Path(path).exists():
        return []
    rows = Later.model_validate(yaml.safe_load(Path(path).read_text())).rows
    if repeated := {row.id for row in rows} & {row.id for row in load_corpus().rows}:
        raise ValueError(f"later.yaml repeats corpus rows {sorted(repeated)}")
    return rows


def all_rows() -> list[Row]:
    """Every row: the split's, then the later ones."""
    return [*load_corpus().rows, *load_later()]


FORMS_TABLE = Path(__file__).with_name("forms.yaml")


class Form(BaseModel):
    """A corpus row reproduced once more, in the form its reporters trained in (forms.yaml):
    the same report, the same root cause, another app (bench/corpus/apps/FORM)."""

    model_config = ConfigDict(extra="forbid")
    id: str
    """The corpus row (an id of corpus.yaml)."""
    form: Literal["hf", "lightning", "ours"]
    """The app it is reproduced in here; the loop form is corpus.yaml's own."""
    switch: str
    """The one config key of that app that plants the bug (`bug.NAME`, true = bug on)."""
    base: list[str] = []
    """Overrides the fault and its clean twin share in that app."""

    @field_validator("switch")
    @classmethod
    def _one_key(cls, switch: str) -> str:
        return Row._one_key(switch)  # the corpus's rule for a switch

    fault_overrides = Row.fault_overrides  # the base, and the switch on
    twin_overrides = Row.twin_overrides  # the base alone


class Forms(BaseModel):
    model_config = ConfigDict(extra="forbid")
    forms: list[Form] = Field(min_length=1)


def load_forms(path: Path = FORMS_TABLE, corpus: Path = CORPUS) -> Forms:
    """forms.yaml: each entry a row of the corpus, each row in a form at most once."""
    forms = Forms.model_validate(yaml.safe_load(Path(path).read_text())).forms
    known = {row.id for row in load_corpus(corpus).rows}
    if unknown := [f.id for f in forms if f.id not in known]:
        raise ValueError(f"forms.yaml names rows the corpus does not have: {unknown}")
    seen = Counter((f.id, f.form) for f in forms)
    if twice := [pair for pair, count in seen.items() if count > 1]:
        raise ValueError(f"forms.yaml gives rows the same form twice: {twice}")
    return Forms(forms=forms)
