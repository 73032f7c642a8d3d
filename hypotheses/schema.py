"""Hypothesis cards: one YAML file per one-variable test, loaded and validated here.

A card is data that anyone can add, so the loader treats every file as untrusted input: files
over 64 KiB are refused before they are parsed, YAML anchors, aliases and explicit tags are
refused (no "billion laughs" expansion, no `!!python/...` construction), and every field is
type-checked. Each refusal is a one-line ValueError that names the file, the field and the fix,
so `hyprun` can print it as is and exit 2.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    Field,
    SkipValidation,
    StringConstraints,
    field_validator,
    model_validator,
)

from hyprun.diag.metric import MetricSpec
from hyprun.diag.schema import Question, Strict, validated

CARDS_DIR = Path(__file__).parent
"""Where the shipped cards live (the package folder, so an installed wheel finds them too)."""

MAX_BYTES = 64 * 1024
"""Largest card file read: a real card is a few hundred bytes; a bigger one is a mistake or an
attack, and refusing it before parsing bounds the work the parser can be made to do."""


ID_PATTERN = re.compile(r"^[a-z0-9_]+$")
"""Card and trigger ids: lower-case snake case, so they are also valid file stems."""

_KEY = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*"
OVERRIDE = re.compile(rf"^(?P<add>\+{{0,2}})(?P<key>{_KEY})=(?P<value>\S.*)$")
"""A Hydra override `key=value` (optionally `+key=` or `++key=` to add a key the baseline
lacks). Deletions (`~key`) are not a hypothesis: nothing is tested by removing a key."""

FACTOR = re.compile(r"^(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
"""A plain positive decimal number, as written after `*` in a relative value."""


def relative_factor(value: str) -> float | None:
    """F of a relative value `*F` (the baseline's value times F: `optim.lr=*0.1` is a tenth of
    the baseline's LR); None when `value` is not relative; ValueError when F is not a plain,
    finite number > 0 (`*1_0`, `*inf`, `*-1` and `*0` are refused, not guessed)."""
    value = value.strip()
    if not value.startswith("*"):
        return None
    factor = value[1:]
    if not FACTOR.match(factor) or not math.isfinite(float(factor)) or float(factor) <= 0:
        raise ValueError(f"'*F' needs a finite factor F > 0, a plain number: got {value!r}")
    return float(factor)


Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
"""A non-empty string."""
Id = Annotated[str, StringConstraints(pattern=ID_PATTERN.pattern)]
"""A card or finding id."""
FindingId = Annotated[str, StringConstraints(pattern=r"^(static\.)?[a-z0-9_]+$")]
"""A finding id: a table row's, where a row named `static.<check>` turns an L0 check into a
finding (diag/tables/warnings.yaml)."""
Effect = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
"""A relative effect >= 0; strict, so YAML 1.1's string `1e-2` or a bool is refused."""


class Metric(Strict):
    """A metric as a card writes it: `{metric: eval/loss, direction: min, min_effect: 0.01}`."""

    metric: Text
    """The MLflow key logged by the job."""
    direction: Literal["min", "max"]
    """`min` when lower is better (loss), `max` when higher is (tokens/s)."""
    min_effect: Effect = 0.0
    """Primary: the smallest improvement worth acting on; guard: the regression tolerated."""


class Primary(Metric):
    """The primary metric: the smallest effect that matters must be written down."""

    min_effect: Effect


class Claim(Strict):
    """What a report claimed for this change, shown next to the measured effect."""

    source: Text
    """Where the claim comes from (a report, a paper, a colleague)."""
    effect: Text
    """The claimed effect in the source's own terms, e.g. "25-40% faster convergence"."""
    confidence: Text | None = None
    """The confidence the source gave, e.g. "85%", if it gave one."""


class Card(Strict):
    """One hypothesis: a config delta that changes exactly one variable, and how to judge it."""

    id: Id
    """Unique id, equal to the file stem, so a finding's `cards:` entry names a file."""
    title: Text
    """A short human title for reports."""
    question: Question
    """The core question the card answers: Q1 convergence, Q2 early anomalies, Q3 speed."""
    statement: Text
    """The hypothesis in the method's form, "I think [cause] because [evidence]"; writing the
    evidence down keeps the test tied to what was observed rather than to habit."""
    delta: tuple[str, ...]
    """Hydra overrides that change one variable: one leaf, or one config-group choice. A value
    `*F` means the baseline's value times F, so the card fits any baseline."""
    primary: MetricSpec
    """The metric that decides the verdict, with the smallest effect that matters."""
    guards: tuple[MetricSpec, ...] = ()
    """Metrics that must not regress beyond seed noise: a win on the primary metric that
    costs, say, throughput or loss elsewhere is not a win."""
    triggers: tuple[FindingId, ...] = ()
    """Finding ids (diag/tables/*.yaml rows) that make this card a candidate to test."""
    claimed: Claim | None = None
    """What a report claimed for this change, so the measured effect can be set beside it."""
    notes: Text | None = None
    """Caveats: why the delta is one variable, when the card does nothing, real-data notes."""
    compound: Text | None = None
    """Set on a group switch whose choices also differ in keys both share (`sched=X` changing
    `sched.warmup_frac`): the reason the switch is tested as one intervention of several
    changes. Without it such a switch is refused; with it the test is labelled compound."""
    path: SkipValidation[Path | None] = Field(default=None, exclude=True)
    """The file the card was loaded from (set by the loader; not a YAML field)."""

    @model_validator(mode="before")
    @classmethod
    def _path_is_not_a_field(cls, data: Any) -> Any:
        if isinstance(data, dict) and "path" in data:
            raise ValueError("`path` is not a card field; remove it")
        return data

    @field_validator("statement")
    @classmethod
    def _method_form(cls, statement: str) -> str:
        if not statement.startswith("I think ") or " because " not in statement:
            raise ValueError("must read 'I think [cause] because [evidence]'")
        return statement

    @field_validator("primary", mode="before")
    @classmethod
    def _primary(cls, value: Any) -> MetricSpec:
        return value if isinstance(value, MetricSpec) else _spec(validated(Primary, value))

    @field_validator("guards", mode="before")
    @classmethod
    def _guards(cls, value: Any) -> tuple[MetricSpec, ...]:
        if not isinstance(value, list | tuple):
            raise ValueError("must be a list of {metric: ..., direction: min|max}")
        return tuple(
            g if isinstance(g, MetricSpec) else _spec(validated(Metric, g, f"item {i}"))
            for i, g in enumerate(value)
        )

    @field_validator("delta")
    @classmethod
    def _one_variable(cls, delta: tuple[str, ...]) -> tuple[str, ...]:
        if not delta:
            raise ValueError('is empty: a card must change one variable, e.g. ["optim.lr=*0.1"]')
        for entry in delta:
            match = OVERRIDE.match(entry)
            if not match:
                raise ValueError(f"{entry!r} is not a Hydra override key=value, e.g. sched=wsd")
            relative_factor(match["value"])
        keys = sorted({override_key(e) for e in delta})
        if len(keys) != 1:
            raise ValueError(f"sets {len(keys)} keys ({', '.join(keys)}): split it into cards")
        return delta

    @property
    def variable(self) -> str:
        """The one key the delta sets (`optim.lr`, or a group name such as `sched`)."""
        return override_key(self.delta[0])


def _spec(metric: Metric) -> MetricSpec:
    return MetricSpec(metric.metric, metric.direction, metric.min_effect)


def override_key(override: str) -> str:
    """The key an override sets, without its `+`/`++` prefix."""
    return override.partition("=")[0].lstrip("+~")


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors, aliases, explicit tags and duplicate keys.

    Aliases are what make a small file expand into gigabytes ("billion laughs"); a card never
    needs them, so the first anchor or alias stops parsing. Explicit tags are refused before
    construction, so nothing but plain YAML scalars, lists and mappings is ever built. Nesting
    is capped too: thousands of `[` in a small file would otherwise exhaust Python's stack."""

    MAX_DEPTH = 16
    """A card nests three levels (card -> guards -> metric); 16 is far more than any needs."""
    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(
                f"line {line}: YAML anchors and aliases (&name, *name) are not "
                "allowed in a card; write the value out"
            )
        tag = getattr(event, "tag", None)
        if tag not in (None, "!"):  # "!" only forces a plain string
            raise _Refused(
                f"line {line}: explicit YAML tag {tag!r} is not allowed in a card; "
                "remove it (cards hold plain strings, numbers and lists)"
            )
        if self._depth >= self.MAX_DEPTH:
            raise _Refused(f"line {line}: nested deeper than {self.MAX_DEPTH} levels")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise _Refused(
                    f"line {key_node.start_mark.line + 1}: duplicate key {key!r}; keep one"
                )
            if isinstance(key, str):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _Refused(Exception):
    """Raised inside the loader; turned into a ValueError naming the file."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _fail(path: Path, name: str, problem: str, fix: str) -> ValueError:
    return ValueError(_one_line(f"{path}: {name}: {problem}; {fix}"))


def _read(path: Path) -> Any:
    """The parsed YAML of `path`, refusing big files before reading them whole."""
    if path.exists() and not path.is_file():  # a FIFO or device would block or never end
        raise _fail(path, "file", "not a regular file", "point to a .yaml card file")
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise _fail(
                path,
                "file",
                f"{size} bytes is over the {MAX_BYTES}-byte limit",
                "a card is a few lines: remove what is not a card field",
            )
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise _fail(
            path,
            "file",
            f"cannot read it ({e.strerror or e})",
            "check the path and its permissions",
        ) from None
    if len(raw) > MAX_BYTES:  # the file grew between stat and read
        raise _fail(path, "file", f"over the {MAX_BYTES}-byte limit", "a card is a few lines")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _fail(path, "file", f"not UTF-8 text (byte {e.start})", "save it as UTF-8") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: never runs code
    except _Refused as e:
        raise _fail(path, "yaml", str(e), "see hypotheses/schema.py for the card format") from None
    except yaml.YAMLError as e:
        raise _fail(
            path,
            "yaml",
            f"not valid YAML ({_one_line(e)})",
            "fix the syntax (indentation, quotes, colons)",
        ) from None


def parse_card(path: Path, data: Any) -> Card:
    """A validated Card from already-parsed YAML `data` read from `path`."""
    if not isinstance(data, dict):
        raise _fail(
            path,
            "file",
            f"must be a YAML mapping, got {type(data).__name__}",
            "start with `id: <file stem>` and the other card fields",
        )
    card = validated(Card, data, str(path))
    if card.id != path.stem:
        raise _fail(
            path,
            "id",
            f"{card.id!r} differs from the file stem {path.stem!r}",
            f"rename the file to {card.id}.yaml or set id: {path.stem}",
        )
    return card.model_copy(update={"path": path})


def load_card(path: Path | str) -> Card:
    """The card in `path`, validated; any problem is a one-line ValueError naming the file."""
    path = Path(path)
    return parse_card(path, _read(path))


def load_cards(directory: Path | str = CARDS_DIR) -> dict[str, Card]:
    """Every `*.yaml` card in `directory`, by id (sorted), each validated as by load_card."""
    return {card.id: card for card in map(load_card, sorted(Path(directory).glob("*.yaml")))}


def cards_for(finding_ids: Iterable[str], cards: Mapping[str, Card] | Iterable[Card]) -> list[Card]:
    """Candidate cards for a diagnosis: those triggered by each finding, in the findings' order
    (the top-ranked finding's cards first), each card once, at its first finding."""
    pool = list(cards.values()) if isinstance(cards, Mapping) else list(cards)
    chosen: dict[str, Card] = {}
    for finding in finding_ids:
        for card in pool:
            if finding in card.triggers and card.id not in chosen:
                chosen[card.id] = card
    return list(chosen.values())
