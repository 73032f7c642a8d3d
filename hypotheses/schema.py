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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from diag.metric import DIRECTIONS, MetricSpec
from diag.schema import QUESTIONS

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


_FIELDS = {
    "id": "the file stem, e.g. id: lr_down_10x",
    "title": "a short title, e.g. title: Reduce the LR 10x",
    "question": "one of Q1, Q2, Q3",
    "statement": "'I think [cause] because [evidence]'",
    "delta": 'a list of Hydra overrides for one variable, e.g. delta: ["optim.lr=*0.1"]',
    "primary": "{metric: eval/loss, direction: min, min_effect: 0.01}",
    "guards": "a list of {metric: ..., direction: min|max}",
    "triggers": "a list of finding ids from diag/tables/*.yaml",
    "claimed": "{source: ..., effect: ..., confidence: ...}",
    "notes": "free text",
}
_REQUIRED = ("id", "title", "question", "statement", "delta", "primary")


@dataclass(frozen=True)
class Claim:
    """What a report claimed for this change, shown next to the measured effect."""

    source: str
    """Where the claim comes from (a report, a paper, a colleague)."""
    effect: str
    """The claimed effect in the source's own terms, e.g. "25-40% faster convergence"."""
    confidence: str | None = None
    """The confidence the source gave, e.g. "85%", if it gave one."""


@dataclass(frozen=True)
class Card:
    """One hypothesis: a config delta that changes exactly one variable, and how to judge it."""

    id: str
    """Unique id, equal to the file stem, so a finding's `cards:` entry names a file."""
    title: str
    """A short human title for reports."""
    question: str
    """The core question the card answers: Q1 convergence, Q2 early anomalies, Q3 speed."""
    statement: str
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
    triggers: tuple[str, ...] = ()
    """Finding ids (diag/tables/*.yaml rows) that make this card a candidate to test."""
    claimed: Claim | None = None
    """What a report claimed for this change, so the measured effect can be set beside it."""
    notes: str | None = None
    """Caveats: why the delta is one variable, when the card does nothing, real-data notes."""
    path: Path | None = field(default=None, compare=False)
    """The file the card was loaded from (not a YAML field)."""

    @property
    def variable(self) -> str:
        """The one key the delta sets (`optim.lr`, or a group name such as `sched`)."""
        return override_key(self.delta[0])


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


def _string(path: Path, name: str, value: Any, example: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, name, f"must be a non-empty string, got {value!r}", f"write {example}")
    return value


def _strings(path: Path, name: str, value: Any, example: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, name, f"must be a list of strings, got {value!r}", f"write {example}")
    return tuple(value)


def _numeric(value: Any) -> bool:
    """A string that reads as a number, such as YAML 1.1's `1e-2` (no dot, so not a float)."""
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)


def _number(path: Path, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        hint = " (YAML reads 1e-2 as a string: write 1.0e-2)" if _numeric(value) else ""
        raise _fail(
            path,
            name,
            f"must be a finite number >= 0, got {value!r}{hint}",
            "write e.g. 0.01 for 1%",
        )
    if value < 0:
        raise _fail(path, name, f"must be >= 0, got {value!r}", "write e.g. 0.01 for 1%")
    return float(value)


def _metric(path: Path, name: str, value: Any, need_effect: bool) -> MetricSpec:
    allowed = {"metric", "direction", "min_effect"}
    if not isinstance(value, dict):
        raise _fail(path, name, f"must be a mapping, got {value!r}", f"write {_FIELDS['primary']}")
    unknown = sorted(set(value) - allowed, key=str)
    if unknown:
        raise _fail(
            path, f"{name}.{unknown[0]}", "unknown field", f"allowed: {', '.join(sorted(allowed))}"
        )
    for key in ("metric", "direction", "min_effect") if need_effect else ("metric", "direction"):
        if key not in value:
            raise _fail(path, f"{name}.{key}", "missing field", f"write {_FIELDS['primary']}")
    metric = _string(path, f"{name}.metric", value["metric"], "metric: eval/loss")
    direction = value["direction"]
    if direction not in DIRECTIONS:
        raise _fail(
            path,
            f"{name}.direction",
            f"must be min or max, got {direction!r}",
            "min when lower is better (loss), max when higher is (tokens/s)",
        )
    effect = _number(path, f"{name}.min_effect", value.get("min_effect", 0.0))
    return MetricSpec(metric, direction, effect)


def _delta(path: Path, value: Any) -> tuple[str, ...]:
    example = '["optim.lr=*0.1"]'
    if isinstance(value, list) and not value:
        raise _fail(
            path, "delta", "is empty: a card must change one variable", f"write delta: {example}"
        )
    delta = _strings(path, "delta", value, f"delta: {example}")
    for entry in delta:
        match = OVERRIDE.match(entry)
        if not match:
            raise _fail(
                path,
                "delta",
                f"{entry!r} is not a Hydra override key=value",
                "e.g. optim.lr=3e-4, sched=wsd or optim.betas=[0.9,0.95]",
            )
        try:
            relative_factor(match["value"])
        except ValueError as err:
            raise _fail(
                path, "delta", f"{entry!r}: {err}", "e.g. optim.lr=*0.1 for a tenth of the LR"
            ) from None
    keys = sorted({override_key(e) for e in delta})
    if len(keys) != 1:
        raise _fail(
            path,
            "delta",
            f"sets {len(keys)} keys ({', '.join(keys)}): a card tests one variable",
            f"split it into {len(keys)} cards",
        )
    return delta


def _claim(path: Path, value: Any) -> Claim:
    allowed = {"source", "effect", "confidence"}
    if not isinstance(value, dict):
        raise _fail(
            path, "claimed", f"must be a mapping, got {value!r}", f"write {_FIELDS['claimed']}"
        )
    unknown = sorted(set(value) - allowed, key=str)
    if unknown:
        raise _fail(
            path, f"claimed.{unknown[0]}", "unknown field", f"allowed: {', '.join(sorted(allowed))}"
        )
    for key in ("source", "effect"):
        if key not in value:
            raise _fail(path, f"claimed.{key}", "missing field", f"write {_FIELDS['claimed']}")
    confidence = value.get("confidence")
    if confidence is not None:
        confidence = _string(path, "claimed.confidence", confidence, "confidence: '85%'")
    return Claim(
        _string(path, "claimed.source", value["source"], "source: the report's name"),
        _string(path, "claimed.effect", value["effect"], 'effect: "25-40% faster convergence"'),
        confidence,
    )


def parse_card(path: Path, data: Any) -> Card:
    """A validated Card from already-parsed YAML `data` read from `path`."""
    if not isinstance(data, dict):
        raise _fail(
            path,
            "file",
            f"must be a YAML mapping, got {type(data).__name__}",
            "start with `id: <file stem>` and the other card fields",
        )
    unknown = sorted(set(data) - set(_FIELDS), key=str)
    if unknown:
        raise _fail(
            path,
            str(unknown[0]),
            "unknown field",
            f"allowed: {', '.join(_FIELDS)} (check the spelling)",
        )
    for name in _REQUIRED:
        if name not in data:
            raise _fail(path, name, "missing field", f"add {name}: {_FIELDS[name]}")

    card_id = _string(path, "id", data["id"], _FIELDS["id"])
    if not ID_PATTERN.match(card_id):
        raise _fail(path, "id", f"{card_id!r} must match [a-z0-9_]+", "use lower-case snake case")
    if card_id != path.stem:
        raise _fail(
            path,
            "id",
            f"{card_id!r} differs from the file stem {path.stem!r}",
            f"rename the file to {card_id}.yaml or set id: {path.stem}",
        )
    question = data["question"]
    if question not in QUESTIONS:
        raise _fail(
            path,
            "question",
            f"must be one of Q1, Q2, Q3, got {question!r}",
            "Q1 convergence, Q2 early anomalies, Q3 speed",
        )
    statement = _string(path, "statement", data["statement"], _FIELDS["statement"])
    if not statement.startswith("I think ") or " because " not in statement:
        raise _fail(
            path,
            "statement",
            "must read 'I think [cause] because [evidence]'",
            "name the cause and the evidence that points to it",
        )

    guards_raw = [] if data.get("guards") is None else data["guards"]
    if not isinstance(guards_raw, list):
        raise _fail(
            path,
            "guards",
            f"must be a list, got {guards_raw!r}",
            "write guards: [{metric: perf/tokens_per_s, direction: max}]",
        )
    guards = tuple(_metric(path, f"guards[{i}]", g, False) for i, g in enumerate(guards_raw))
    triggers_raw = [] if data.get("triggers") is None else data["triggers"]
    triggers = _strings(path, "triggers", triggers_raw, "triggers: [underfitting]")
    for trigger in triggers:
        if not ID_PATTERN.match(trigger):
            raise _fail(
                path,
                "triggers",
                f"{trigger!r} is not a finding id",
                "use the `id` of a row in diag/tables/*.yaml",
            )
    claimed = data.get("claimed")
    notes = data.get("notes")
    return Card(
        id=card_id,
        title=_string(path, "title", data["title"], _FIELDS["title"]),
        question=question,
        statement=statement,
        delta=_delta(path, data["delta"]),
        primary=_metric(path, "primary", data["primary"], True),
        guards=guards,
        triggers=triggers,
        claimed=None if claimed is None else _claim(path, claimed),
        notes=None if notes is None else _string(path, "notes", notes, "notes: free text"),
        path=path,
    )


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
