"""The app benchmark's table: every form, family and entry of table.yaml is validated by these
models on load, and an entry's overrides are built here (one place, so the test that each
entry's switch is one variable reads what the benchmark runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

TABLE = Path(__file__).with_name("table.yaml")
REPAIRS = Path(__file__).with_name("repairs.yaml")


class Form(BaseModel):
    """One app form: a Hydra app of the repository and the keys the families plant through."""

    model_config = ConfigDict(extra="forbid")
    app: str
    """The app as `hyprun baseline --app` names it (module:function)."""
    base: list[str] = []
    """Overrides every entry of this form shares (the tiny budget)."""
    best_lr: float
    """The LR this form trains best at within the budget (measured: tests/test_app_evidence.py);
    the LR families scale from it and healthy entries sit in a band around it."""
    keys: dict[str, str]
    """Per knob a family plants (lr, weight_decay, warmup, clip, frozen): this app's key."""


class Family(BaseModel):
    """A fault family: what it sets, which findings name it, which card removes it."""

    model_config = ConfigDict(extra="forbid")
    setting: dict[str, str] = {}
    """Knob -> value template of the setting the fault harms in (a high LR for warmup and
    clipping), not the fault itself; {m} is the magnitude, {lr} the form's best LR."""
    plants: dict[str, str] = Field(min_length=1, max_length=1)
    """The one knob the fault sets, and its value template (as for setting)."""
    cause: list[str] = Field(min_length=1)
    """Finding ids that name the fault: a top-1 (top-3) hit is one of them ranked first (in the
    first three)."""
    fix: list[str]
    """Cards whose one-variable test removes the fault ("code_fix": the switch off)."""
    magnitudes: list[float] = Field(min_length=1)
    """Magnitudes the split divides between tuning and held-out (one magnitude: both sets get
    it, on different data seeds)."""
    forms: list[str] = Field(min_length=1)
    """Forms with a key for every knob the family plants."""


class Healthy(BaseModel):
    """A healthy app configuration: any finding on it is a false alarm."""

    model_config = ConfigDict(extra="forbid")
    id: str
    form: str
    overrides: list[str]
    """What differs from the form's defaults (LR in band, size, batch, schedule)."""


class Table(BaseModel):
    model_config = ConfigDict(extra="forbid")
    forms: dict[str, Form]
    families: dict[str, Family]
    unplantable: dict[str, str] = {}
    """Families of the issue no app here can plant yet, and why."""
    healthy: list[Healthy] = Field(min_length=6)

    @model_validator(mode="after")
    def _consistent(self) -> Table:
        for name, family in self.families.items():
            for form in family.forms:
                missing = {*family.setting, *family.plants} - set(self.forms[form].keys)
                if missing:
                    raise ValueError(f"family {name}: form {form} has no key for {missing}")
        for entry in self.healthy:
            if entry.form not in self.forms:
                raise ValueError(f"healthy {entry.id}: no form {entry.form}")
        return self


class Entry(BaseModel):
    """One benchmark entry as the split lists it: a planted fault or a healthy config."""

    model_config = ConfigDict(extra="forbid")
    id: str
    form: str
    family: str | None = None
    """None for a healthy entry."""
    m: float | None = None
    seed: int = 0
    """The entry's data seed (the form's data_seed key, set by the baseline's overrides): which
    training sequences are drawn and in what order; hyprun's seeds 0, 1 vary the init."""
    kind: Literal["fault", "healthy"] = "fault"


def load_table(path: Path = TABLE) -> Table:
    return Table.model_validate(yaml.safe_load(Path(path).read_text()))


class Repair(BaseModel):
    """A broken entry of table.yaml mended after the split (said in the commit). The split and
    each draw record the table they were drawn from; the repairs chain that table to today's."""

    model_config = ConfigDict(extra="forbid")
    before: str
    """sha256 of table.yaml before the repair."""
    after: str
    """sha256 of table.yaml after it."""
    entries: list[str] = Field(min_length=1)
    """The ids of the entries it changed."""
    measured: str
    """What showed the entry broken, with the numbers."""
    from_draw: str
    """The first draw scored with the repaired table (earlier draws keep the old entry)."""


def load_repairs(path: Path = REPAIRS) -> list[Repair]:
    return [Repair.model_validate(r) for r in yaml.safe_load(Path(path).read_text())["repairs"]]


def value(template: str, m: float, lr: float) -> str:
    """A template's value: "{m}", "{lr}*{m}", "{lr}/{m}" or a literal (no eval of text)."""
    computed = {"{m}": m, "{lr}*{m}": lr * m, "{lr}/{m}": lr / m}
    return f"{computed[template]:.4g}" if template in computed else template


def overrides(table: Table, entry: Entry, part: str) -> list[str]:
    """The overrides of an entry's family `part` ("setting" or "plants") in its form's keys."""
    if entry.family is None:
        return []
    form, family = table.forms[entry.form], table.families[entry.family]
    templates = getattr(family, part)
    return [f"{form.keys[k]}={value(t, entry.m, form.best_lr)}" for k, t in templates.items()]


def plant(table: Table, entry: Entry) -> list[str]:
    """The one override that plants the entry's fault (empty for a healthy entry)."""
    return overrides(table, entry, "plants")


def twin_of(table: Table, entry: Entry) -> list[str]:
    """The entry's clean twin: its form's base and its family's setting, the fault not planted."""
    return [*table.forms[entry.form].base, *overrides(table, entry, "setting")]


def overrides_of(table: Table, entry: Entry) -> list[str]:
    """Every override of an entry's baseline: the form's base, the healthy config or the
    plant; the data seed is applied by the runner."""
    if entry.family is None:
        healthy = {h.id: h for h in table.healthy}[entry.id]
        return [*table.forms[entry.form].base, *healthy_lr(table, entry, healthy.overrides)]
    return [*twin_of(table, entry), *plant(table, entry)]


def healthy_lr(table: Table, entry: Entry, overrides: list[str]) -> list[str]:
    """A healthy config runs at its form's best LR unless it sets its own (as the family split's
    healthy entries do): the apps' own default LR, 3x below it, is 3x short of the best at this
    budget (tests/test_app_evidence.py), which the step scan rightly reads as steps_too_short."""
    key = table.forms[entry.form].keys["lr"]
    if any(o.split("=", 1)[0].lstrip("+") == key for o in overrides):
        return overrides
    return [f"{key}={table.forms[entry.form].best_lr:g}", *overrides]
