"""Triage: match a run's features against the pattern tables and rank what fired.

The method's pattern tables ("Loss not decreasing", "Efficiency problems", "Architecture
anomalies", plus early anomalies and data) live as rows in `diag/tables/*.yaml`: a row fires
when all its conditions hold on the measured features. Nothing here knows a threshold; users add
or tune rows without touching code. A table file is any YAML in the folder whose top-level
mapping has `patterns:` (and optionally `obvious:`); other YAML there (hardware peaks, L0 static
check settings) is not ours and is skipped.

Ranking: `priority` first (a tier: divergence and NaN outrank everything, then config mistakes,
convergence, efficiency, early signals), then severity, a measured "how far from healthy" ratio.
No row silences another. Two rules keep the list to one line per cause instead:
- rows that `explain` the same cause (an LR too high, read from the L0 band, the drift or the
  step scan) make one finding: the first-ranked leads, the others' evidence joins it as `also`;
- a `symptom` row (the loss curve's shape alone, which many causes produce) is listed after the
  cause rows of Q1 and Q2 that fired with it, never before them.
"""

from __future__ import annotations

import math
import numbers
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field as PydanticField
from pydantic import model_validator

from hyprun.diag.evidence import Evidence, plain
from hyprun.diag.features import Feature, Features, evidence_for, features
from hyprun.diag.reference import healthy_range
from hyprun.diag.schema import QUESTIONS, Group, Question, Strict, read_yaml, validated

TABLES_DIR = Path(__file__).parent / "tables"
"""Where the shipped tables live."""

ORDERING = (">", "<", ">=", "<=")
"""Comparison operators that need a numeric threshold."""

SEVERITY_CAP = 1e6
"""A ratio against a zero value would be infinite; the ranking only needs "very far"."""
STATUS_SEVERITY = {"warn": 1.0, "fail": 2.0}
"""Severity of an L0 check whose threshold is prose, not a number (diag/static.py writes e.g.
"exact duplicates <= 1% (fail > 10%)"): a fail is further from healthy than a warn. With a
numeric threshold the severity is the measured ratio value/threshold instead."""
STATIC_FALLBACK_PRIORITY = 60
"""Priority of a failed L0 check that no table row mentions: it still reaches the report, just
below the rows written for known checks."""
STATIC_FALLBACK_GROUP = {
    "Q1": "training dynamics",
    "Q2": "data pipeline",
    "Q3": "scaling/distribution",
}
"""Group of such a check, from the question it names."""

_TEMPLATE = re.compile(r"\{([A-Za-z0-9_./]+)\}")


class Condition(Strict):
    """One comparison of a feature with a threshold."""

    feature: str
    """Feature name, e.g. `loss_oscillation` or `static.duplicates`."""
    op: Literal[">", "<", ">=", "<=", "==", "!=", "in"]
    """The comparison; `in`: the value is one of a list."""
    threshold: Any
    """A number for ordering ops; a number, string or null for ==/!=; a list for `in`."""
    field: Literal["value", "status"] = "value"
    """`value`, or `status` to read an L0 check's pass | warn | fail | skip."""

    @model_validator(mode="after")
    def _threshold_fits_op(self) -> Condition:
        if self.op in ORDERING and not _is_number(self.threshold):
            raise ValueError(
                f"op {self.op!r} needs a number, got {self.threshold!r}; "
                "write a number (YAML 1.1 reads 1e-5 as a string: write 1.0e-5)"
            )
        if self.op == "in" and not isinstance(self.threshold, list | tuple):
            raise ValueError(f"op 'in' needs a list, got {self.threshold!r}; write [a, b]")
        return self

    def text(self) -> str:
        """`feature op threshold`, as written in the table."""
        name = self.feature if self.field == "value" else f"{self.feature}.{self.field}"
        return f"{name} {self.op} {'null' if self.threshold is None else self.threshold}"


class Pattern(Strict):
    """One table row: evidence that, when all its conditions hold, points to a likely cause."""

    id: str
    """Unique row id; the finding carries it."""
    table: str
    """The method's table this row belongs to."""
    group: Group
    """Where a report sorts the finding (one of hyprun.diag.schema.GROUPS)."""
    question: Question
    """Q1 | Q2 | Q3 (hyprun.diag.schema.QUESTIONS)."""
    evidence: str
    """What was seen, in words; `{feature}` placeholders are filled with measured values."""
    cause: str
    """The likely cause."""
    first_action: str
    """What to check or test first."""
    cards: tuple[str, ...]
    """Hypothesis card ids that test this cause one variable at a time."""
    when: tuple[Condition, ...] = PydanticField(min_length=1)
    """Conditions, all of which must hold."""
    when_any: tuple[tuple[Condition, ...], ...] = ()
    """Alternative evidence for one cause: when given, at least one group must hold in full
    besides `when` (e.g. `when` the L0 warning, `when_any` each harm that shows it mattered).
    One row per cause with its evidence OR'd, instead of a row per piece of evidence."""
    priority: int = 0
    """Ranking tier; higher first, severity breaks ties within a tier."""
    explains: str = ""
    """The cause this row is one reading of, shared with the cause's other rows (e.g.
    `lr_too_high`): findings that explain one cause are shown as one. Empty: the row's own id."""
    symptom: bool = False
    """The row reads only the loss curve's shape (flat, slow, plateaued), which many causes
    produce: it is ranked after every Q1/Q2 cause row that fired with it."""
    show: tuple[str, ...] = ()
    """Extra features whose numbers the finding carries for context."""
    severity_feature: str | None = None
    """A feature whose numeric value is the severity, instead of the conditions' ratios."""
    flatters_loss: bool = False
    """The cause makes the run's reported loss read better than the model's (a wrong
    normaliser): a test that removes it is judged by the row no longer firing, not by the loss
    it stopped flattering (runner/control/verdicts.py, leaks_removed)."""
    source: str = ""
    """The file the row came from (for messages; set by the loader, not written in YAML)."""

    def conditions(self) -> tuple[Condition, ...]:
        """Every condition the row reads: `when`, then each `when_any` group's."""
        return self.when + tuple(c for group in self.when_any for c in group)


class ObviousCheck(Strict):
    """One item of the method's "check the obvious first" list."""

    id: str
    """Check id."""
    check: str
    """The question it answers, in words."""
    when: tuple[Condition, ...] = PydanticField(min_length=1)
    """Conditions that all hold on a sane run; any that fails makes the check fail."""


class TableFile(Strict):
    """A pattern-table file: rows, and optionally items of the obvious-first list."""

    patterns: tuple[dict, ...] = ()
    """Pattern rows (validated one by one, so an error names its row)."""
    obvious: tuple[dict, ...] = ()
    """Obvious-first checks (validated one by one)."""


@dataclass
class Finding:
    """A fired pattern with the numbers that made it fire."""

    id: str
    """The row id."""
    question: str
    """Q1 | Q2 | Q3."""
    group: str
    """One of GROUPS."""
    evidence: str
    """What was seen, with values filled in."""
    cause: str
    """The likely cause."""
    first_action: str
    """What to check or test first."""
    cards: list[str]
    """Hypothesis card ids to test."""
    severity: float
    """How far from healthy, as a ratio to the threshold (>= 1 means past it)."""
    numbers: dict[str, float | str | None] = field(default_factory=dict)
    """Measured feature values behind the finding (conditions, then `show`)."""
    details: list[str] = field(default_factory=list)
    """One line per condition and shown feature, with the numbers and the threshold."""
    table: str = ""
    """The method's table."""
    priority: int = 0
    """The row's ranking tier."""
    explains: str = ""
    """The cause the finding names when rows share it (the row's `explains`)."""
    symptom: bool = False
    """From a symptom row (ranked after the causes of Q1/Q2 that fired)."""
    also: list[dict[str, str]] = field(default_factory=list)
    """Further rows that read the same cause in this run: {id, evidence}, in rank order."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return {
            "id": self.id,
            "question": self.question,
            "group": self.group,
            "table": self.table,
            "evidence": self.evidence,
            "cause": self.cause,
            "first_action": self.first_action,
            "cards": list(self.cards),
            "severity": _json_num(self.severity),
            "priority": self.priority,
            "explains": self.explains,
            "symptom": self.symptom,
            "also": list(self.also),
            "numbers": {k: _json_num(v) for k, v in self.numbers.items()},
            "details": list(self.details),
        }


@dataclass
class Diagnosis:
    """What triage concluded about one run."""

    question: str
    """The core question to work on: that of the top finding, else the one the evidence
    implies."""
    obvious: list[dict[str, Any]]
    """The "check the obvious first" list: {id, check, status (pass|fail|skip), numbers,
    details}."""
    findings: list[Finding]
    """Fired patterns, most important first."""
    features: Features = field(default_factory=dict)
    """Every measured feature, for the report."""
    not_judged: list[dict[str, Any]] = field(default_factory=list)
    """Rows that could neither fire nor be ruled out for lack of evidence: {id, question,
    missing (features), needs (the evidence that would measure them)}."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return {
            "question": self.question,
            "obvious": _json_num(self.obvious),
            "findings": [f.to_dict() for f in self.findings],
            "features": {k: _json_num(f.to_dict()) for k, f in self.features.items()},
            "not_judged": _json_num(self.not_judged),
            "missing_evidence": missing_evidence(self.not_judged),
        }


def _json_num(x: Any) -> Any:
    """JSON-ready copy (see `hyprun.diag.evidence.plain`)."""
    return plain(x)


# ---------------------------------------------------------------- loading


def _is_number(x: Any) -> bool:
    """A real number (numpy scalars included), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool | np.bool_)


def _row(model: type[Strict], path: Path, item: Any, kind: str) -> Any:
    """One entry of a table file, validated; errors name the file and the entry's id."""
    entry = item.get("id") if isinstance(item, dict) else None
    return validated(model, item, f"{path}: {kind} {entry!r}")


def _table_files(tables_dir: Path) -> list[tuple[Path, TableFile]]:
    """(path, validated file) of the table files in `tables_dir`: YAML files whose top level
    has `patterns:` or `obvious:` (others there, such as hardware peaks, are not tables)."""
    out = []
    for path in sorted(Path(tables_dir).glob("*.yaml")):
        data = read_yaml(path)
        if isinstance(data, dict) and {"patterns", "obvious"} & set(data):
            out.append((path, validated(TableFile, data, str(path))))
    return out


def load_tables(tables_dir: Path | str = TABLES_DIR) -> list[Pattern]:
    """Every pattern row in the folder, validated: an unknown key, an unknown op, a missing
    field, a duplicate id or an `explains` no other row shares is a ValueError naming file and
    row."""
    rows: list[Pattern] = []
    seen: dict[str, Path] = {}
    for path, table in _table_files(Path(tables_dir)):
        for item in table.patterns:
            row = _row(Pattern, path, item, "row").model_copy(update={"source": str(path)})
            if row.id in seen:
                raise ValueError(f"{path}: row {row.id!r}: duplicate id (also in {seen[row.id]})")
            seen[row.id] = path
            rows.append(row)
    shared = Counter(row.explains for row in rows if row.explains)
    for row in rows:
        if row.explains and shared[row.explains] < 2:
            raise ValueError(
                f"{row.source}: row {row.id!r}: no other row explains {row.explains!r}; "
                "fix the spelling or drop explains"
            )
    return rows


def load_obvious(tables_dir: Path | str = TABLES_DIR) -> list[ObviousCheck]:
    """The "check the obvious first" items from the `obvious:` sections."""
    return [
        _row(ObviousCheck, path, item, "obvious check")
        for path, table in _table_files(Path(tables_dir))
        for item in table.obvious
    ]


# ---------------------------------------------------------------- evaluation


def _read(cond: Condition, feats: Features) -> tuple[bool, Any]:
    """(present, value) of what the condition reads."""
    feat = feats.get(cond.feature)
    if feat is None:
        return False, None
    value = feat.status if cond.field == "status" else feat.value
    return value is not None, value


def holds(cond: Condition, feats: Features) -> bool | None:
    """True/False, or None when the feature is missing (unknown: the condition cannot fire).
    `== null` holds exactly when the feature is missing or None."""
    present, value = _read(cond, feats)
    if cond.op == "==" and cond.threshold is None:
        return not present
    if not present:
        return None
    if cond.op == "!=" and cond.threshold is None:
        return True
    if cond.op == "in":
        return value in cond.threshold
    if cond.op in ("==", "!="):
        same = (
            float(value) == float(cond.threshold)
            if _is_number(value) and _is_number(cond.threshold)
            else value == cond.threshold
        )
        return same if cond.op == "==" else not same
    if not _is_number(value) or not math.isfinite(float(value)):
        return None
    v, t = float(value), float(cond.threshold)
    return {">": v > t, "<": v < t, ">=": v >= t, "<=": v <= t}[cond.op]


def _ratio(cond: Condition, feat: Feature | None) -> float | None:
    """How far past its threshold a holding condition is, as a ratio >= ~1; None when the
    condition carries no magnitude (an equality, a sign change)."""
    if feat is None:
        return None
    if cond.field == "status":
        v, t = feat.value, feat.threshold
        if _is_number(v) and _is_number(t) and v > 0 and t > 0:
            return min(max(v / t, t / v), SEVERITY_CAP)
        return STATUS_SEVERITY.get(str(feat.status))
    if cond.op not in (">", ">=", "<", "<=") or not _is_number(feat.value):
        return None
    v, t = float(feat.value), float(cond.threshold)
    if t <= 0:
        return None
    if cond.op in (">", ">="):
        return min(v / t, SEVERITY_CAP) if v > 0 else None
    return SEVERITY_CAP if v <= 0 else min(t / v, SEVERITY_CAP)


def _fmt(x: Any) -> str:
    if _is_number(x):
        return f"{x:.3g}"
    return "none" if x is None else str(x)


def _fill(text: str, feats: Features) -> str:
    """Replace `{feature}` with its measured value; unknown names stay as written."""

    def one(match: re.Match) -> str:
        feat = feats.get(match.group(1))
        return match.group(0) if feat is None else _fmt(feat.value)

    return _TEMPLATE.sub(one, text)


def _holding_group(row: Pattern, feats: Features) -> tuple[Condition, ...] | None:
    """The conditions that made `row` fire: `when` plus its strongest holding `when_any` group
    (the one furthest past its thresholds); None when the row does not fire."""
    if not all(holds(c, feats) for c in row.when):
        return None
    if not row.when_any:
        return row.when
    holding = [g for g in row.when_any if all(holds(c, feats) for c in g)]
    if not holding:
        return None
    return row.when + max(holding, key=lambda group: _severity(group, feats))


def _beside(cond: Condition) -> str:
    """What healthy runs measure, beside a numeric cut (diag/reference.py)."""
    return healthy_range(cond.feature) if cond.op in ORDERING and cond.field == "value" else ""


def _severity(conditions: tuple[Condition, ...], feats: Features) -> float:
    """The smallest ratio past threshold among the conditions (1.0 when none has a size)."""
    ratios = [r for c in conditions if (r := _ratio(c, feats.get(c.feature))) is not None]
    return min(ratios) if ratios else 1.0


def _fire(row: Pattern, feats: Features) -> Finding | None:
    conditions = _holding_group(row, feats)
    if conditions is None:
        return None
    numbers: dict[str, Any] = {}
    details: list[str] = []
    for cond in conditions:
        feat = feats.get(cond.feature)
        if feat is None:
            details.append(f"{cond.text()}: {cond.feature} not measured")
            continue
        numbers[cond.feature] = feat.value
        details.append("; ".join(filter(None, [f"{cond.text()}: {feat.detail}", _beside(cond)])))
    for name in row.show:
        feat = feats.get(name)
        if feat is not None and name not in numbers:
            numbers[name] = feat.value
            details.append(feat.detail)
    severity = _severity(conditions, feats)
    if row.severity_feature:
        feat = feats.get(row.severity_feature)
        if feat is not None and _is_number(feat.value) and math.isfinite(float(feat.value)):
            severity = float(feat.value)
    return Finding(
        id=row.id,
        question=row.question,
        group=row.group,
        evidence=_fill(row.evidence, feats),
        cause=_fill(row.cause, feats),
        first_action=_fill(row.first_action, feats),
        cards=list(row.cards),
        severity=severity,
        numbers=numbers,
        details=details,
        table=row.table,
        priority=row.priority,
        explains=row.explains,
        symptom=row.symptom,
    )


def fire(rows: list[Pattern], feats: Features) -> list[Finding]:
    """The rows whose conditions hold on `feats`, as findings (unranked)."""
    return [finding for row in rows if (finding := _fire(row, feats)) is not None]


def flattering_row_ids(tables_dir: Path | str = TABLES_DIR) -> set[str]:
    """The rows marked flatters_loss."""
    return {row.id for row in load_tables(tables_dir) if row.flatters_loss}


def flattering_rows_fired(evidence: Evidence, tables_dir: Path | str = TABLES_DIR) -> set[str]:
    """The ids of the rows marked flatters_loss whose conditions hold on this run."""
    rows = [row for row in load_tables(tables_dir) if row.flatters_loss]
    return {finding.id for finding in fire(rows, features(evidence))}


def _static_fallback(evidence: Evidence, rows: list[Pattern], feats: Features) -> list[Finding]:
    """A failed L0 check that no row mentions still becomes a finding."""
    known = {c.feature for row in rows for c in row.conditions()}
    out = []
    for check in evidence.static:
        name = f"static.{check.get('id')}"
        if check.get("status") != "fail" or name in known or name not in feats:
            continue
        question = check.get("question") if check.get("question") in QUESTIONS else "Q1"
        feat = feats[name]
        out.append(
            Finding(
                id=name,
                question=question,
                group=STATIC_FALLBACK_GROUP[question],
                evidence=f"L0 static check {check.get('id')} failed",
                cause=str(check.get("why") or "a failed static check"),
                first_action="fix the configuration the check names, then rerun the baseline",
                cards=[],
                severity=_ratio(
                    Condition(feature=name, op="==", threshold="fail", field="status"), feat
                )
                or 1.0,
                numbers={name: feat.value},
                details=[feat.detail],
                table="L0 static checks",
                priority=STATIC_FALLBACK_PRIORITY,
            )
        )
    return out


def check_obvious(checks: list[ObviousCheck], feats: Features) -> list[dict[str, Any]]:
    """Evaluate the obvious list: fail if any condition fails, skip if one cannot be
    measured and none failed, else pass."""
    out = []
    for check in checks:
        results = [holds(c, feats) for c in check.when]
        status = "fail" if False in results else ("skip" if None in results else "pass")
        numbers: dict[str, Any] = {}
        details = []
        for cond, ok in zip(check.when, results, strict=True):
            feat = feats.get(cond.feature)
            if feat is not None:
                numbers[cond.feature] = _json_num(feat.value)
            verdict = {True: "ok", False: "FAILS", None: "not measured"}[ok]
            details.append(f"{cond.text()}: {verdict}" + (f" ({feat.detail})" if feat else ""))
        out.append(
            {
                "id": check.id,
                "check": check.check,
                "status": status,
                "numbers": numbers,
                "details": details,
            }
        )
    return out


def not_judged(rows: list[Pattern], feats: Features) -> list[dict[str, Any]]:
    """Rows that no measured number ruled out but that a missing (or non-finite) feature kept
    from firing: skipped, not guessed, and named with the evidence they would need."""
    out = []
    for row in rows:
        unknown, ruled_out = _unknown_and_ruled_out(row.when, feats)
        if row.when_any and not ruled_out:
            groups = [_unknown_and_ruled_out(group, feats) for group in row.when_any]
            if any(not missing and not failed for missing, failed in groups):
                continue  # a group holds: the row fired, nothing is missing
            open_groups = [missing for missing, failed in groups if not failed]
            ruled_out = not open_groups
            unknown += [feature for missing in open_groups for feature in missing]
        if not unknown or ruled_out:
            continue
        missing = sorted(set(unknown))
        out.append(
            {
                "id": row.id,
                "question": row.question,
                "missing": missing,
                "needs": sorted({evidence_for(f) for f in missing}),
            }
        )
    return out


def _unknown_and_ruled_out(
    conditions: tuple[Condition, ...], feats: Features
) -> tuple[list[str], bool]:
    """(the features these conditions lack, whether a measured one fails)."""
    unknown = [c.feature for c in conditions if holds(c, feats) is None and _unmeasured(c, feats)]
    ruled_out = any(holds(c, feats) is not True for c in conditions if c.feature not in unknown)
    return unknown, ruled_out


def _unmeasured(cond: Condition, feats: Features) -> bool:
    """The run lacks what `cond` reads: the feature is absent, or its number is not finite. (A
    feature measured as None, e.g. no NaN module, is an answer: `!= null` is then ruled out.)"""
    feat = feats.get(cond.feature)
    if feat is None:
        return True
    value = feat.status if cond.field == "status" else feat.value
    return _is_number(value) and not math.isfinite(float(value))


def missing_evidence(skipped: list[dict[str, Any]]) -> dict[str, list[str]]:
    """{evidence the run lacks: the rows it kept from being judged}."""
    by_need: dict[str, list[str]] = {}
    for row in skipped:
        for need in row["needs"]:
            by_need.setdefault(need, []).append(row["id"])
    return dict(sorted(by_need.items()))


def ranked(findings: list[Finding]) -> list[Finding]:
    """Tier, then severity; a symptom after every Q1/Q2 cause that fired with it."""
    cause_fired = any(not f.symptom and f.question in ("Q1", "Q2") for f in findings)
    return sorted(
        findings, key=lambda f: (f.symptom and cause_fired, -f.priority, -f.severity, f.id)
    )


def one_per_cause(findings: list[Finding]) -> list[Finding]:
    """The first finding of each cause, in rank order, carrying the later ones' evidence,
    numbers and cards (one cause, one line, one set of tests)."""
    leaders: dict[str, Finding] = {}
    for finding in findings:
        leader = leaders.setdefault(finding.explains or finding.id, finding)
        if leader is finding:
            continue
        leader.also.append({"id": finding.id, "evidence": finding.evidence})
        leader.cards += [card for card in finding.cards if card not in leader.cards]
        for name, value in finding.numbers.items():
            leader.numbers.setdefault(name, value)
        leader.details += [line for line in finding.details if line not in leader.details]
    return list(leaders.values())


def cause_rank(findings: list[dict[str, Any]], cause: Any) -> int | None:
    """Where the first finding (as `Finding.to_dict` writes it) that names one of the row ids
    in `cause` ranks, counting from 1: its own row, or a reading merged into it. None: none."""
    wanted = set(cause)
    for rank, finding in enumerate(findings, 1):
        if wanted & {finding["id"], *(also["id"] for also in finding.get("also", []))}:
            return rank
    return None


def _implied_question(evidence: Evidence) -> str:
    """With no finding: the question of the first L0 check that is not clean, else Q1."""
    for check in evidence.static:
        if check.get("status") in ("fail", "warn") and check.get("question") in QUESTIONS:
            return str(check["question"])
    return "Q1"


def triage(evidence: Evidence, tables_dir: Path | str = TABLES_DIR) -> Diagnosis:
    """Measure features, fire the table rows, rank the findings, evaluate the obvious list."""
    feats = features(evidence)
    rows = load_tables(tables_dir)
    kept = one_per_cause(ranked(fire(rows, feats) + _static_fallback(evidence, rows, feats)))
    obvious = check_obvious(load_obvious(tables_dir), feats)
    question = kept[0].question if kept else _implied_question(evidence)
    skipped = not_judged(rows, feats)
    return Diagnosis(question, obvious, kept, feats, not_judged=skipped)
