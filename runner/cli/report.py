"""`hyprun report`: an investigation as a Markdown file and an HTML page with PNG plots.

Both read offline (the images are files beside them, linked by relative paths) and are logged
on the parent run under `report/`. They hold the core question, the L0 static checks, the L1
evidence of the baseline (the obvious checks, the findings with their numbers, the measured
features), the hypothesis table (delta, verdict, effect ± noise, claimed vs measured, tokens
spent and saved, seeds run) and plots at matched tokens: the baseline's seeds as a band, each
test's seed mean as a line, for every test's primary metric and for loss, gradient norm and data
loading. Every number is the one that decided the verdict (a guard's, when a guard's regression
rejected the test), in diag/effect.py's one sign convention, counted in the unit the primary
metric's step counts (tokens for our job, an app's declared `metric.step`).

MLflow's artifact viewer shows the HTML from a `blob:` URL, against which relative image paths
cannot resolve; a few lines of script fetch them from the tracking server there instead.
Opened from disk the page runs no network request.
"""

from __future__ import annotations

import html
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from matplotlib.figure import Figure

from hyprun.diag.effect import change, deciding_guard, describe, metric_key
from hyprun.diag.schema import QUESTIONS
from hyprun.runner import markdown
from hyprun.runner.store.investigation import STRIKES, State, Store, Test
from hyprun.runner.store.tracking import redact

ARTIFACT_DIR = "report"
"""Where on the parent run the report is logged."""
PLOTS = {  # metric -> file stem; each test's primary metric is added when it is another
    "eval/loss": "eval_loss",
    "train/loss": "train_loss",
    "grad/norm": "grad_norm",
    "perf/data_wait_frac": "data_wait",
}


def hypothesis_head(unit: str) -> list[str]:
    """The hypothesis table's columns; `unit`: what the primary metric's step counts."""
    return [
        "test",
        "delta",
        "verdict",
        "effect: change vs baseline ± noise",
        "claimed",
        "measured",
        f"{unit} spent",
        f"{unit} saved",
        "seeds per side",
        "why it stopped",
    ]


STATUS_ORDER = {"fail": 0, "warn": 1, "pass": 2, "skip": 3}
NOISE = ("eval/loss", "train/loss", "perf/tokens_per_s")
"""Headline metrics whose seed mean and std record_baseline logs on the parent run."""


@dataclass
class Table:
    """One section of the report: a titled table, or `empty` when it has no rows."""

    title: str
    head: list[str]
    rows: list[list[str]]
    empty: str = "none"
    code: tuple[int, ...] = ()
    """Columns shown as code (overrides)."""
    intro: str = ""


class TestRow(NamedTuple):
    """One test as the hypothesis table shows it, with what the facts and reasons need."""

    cells: list[str]
    reason: str
    spent: int
    saved: int
    primary: str
    """The metric the verdict was taken on."""
    added: int = 0
    """Tokens (an app's steps) of the baseline seeds its rounds added."""


@dataclass
class Report:
    """Everything the report shows, gathered once and rendered as Markdown and as HTML."""

    name: str
    run_id: str
    facts: list[tuple[str, str]]
    """(label, value) lines under the title."""
    tables: list[Table]
    reasons: list[tuple[str, str, str]]
    """(test, why it was run, the verdict's reason)."""
    primaries: list[str]
    """Each test's primary metric: each gets a plot."""
    images: list[Path] = field(default_factory=list)


def write_report(store: Store, state: State, out: Path) -> tuple[Path, Path]:
    """Write `report.md`, `report.html` and the plots into `out`; log them on the parent run."""
    out.mkdir(parents=True, exist_ok=True)
    report = gather(store, state)
    metrics = dict(PLOTS)
    for primary in report.primaries:
        if primary not in metrics:
            metrics[primary] = _unique_stem(primary, set(metrics.values()))
    report.images = [
        p
        for metric, stem in metrics.items()
        if (p := plot(store, state, metric, out / f"{stem}.png"))
    ]
    markdown, page = out / "report.md", out / "report.html"
    markdown.write_text(redact(render_markdown(report)))
    page.write_text(redact(render_html(report)))
    for path in [markdown, page, *report.images]:
        store.attach(state.run_id, path, ARTIFACT_DIR)
    return markdown, page


def _unique_stem(metric: str, taken: set[str]) -> str:
    """A plot's file name for `metric` that no other plot has: an app's `eval_loss` beside
    our eval/loss gets `eval_loss_2`, not the same file listed twice."""
    stem = base = re.sub(r"[^A-Za-z0-9]+", "_", metric).strip("_") or "metric"
    number = 2
    while stem in taken:
        stem, number = f"{base}_{number}", number + 1
    return stem


# ------------------------------------------------------------------------------------ gathering


def gather(store: Store, state: State) -> Report:
    """The report's content, read from the investigation's runs and artifacts in MLflow."""
    parent = store.run(state.run_id)
    diagnosis = store.json_artifact(state.run_id, "diagnosis.json") or {}
    budget = _budget(store, state)
    rows = [_test_row(store, t, budget, state) for t in state.tests]
    hypotheses = Table(
        "Hypotheses",
        hypothesis_head(state.unit),
        [r.cells for r in rows],
        empty="no hypothesis tested yet",
        code=(1,),
        intro=f"Each test against the baseline's seeds, at matched {state.unit}.",
    )
    tables = [
        _static_table(diagnosis.get("static", [])),
        _obvious_table(diagnosis.get("obvious", [])),
        _findings_table(diagnosis.get("findings", [])),
        _features_table(diagnosis.get("features", {})),
        hypotheses,
    ]
    reasons = [
        (
            f"H{t.number}" + (f" (by {t.user})" if t.user else ""),
            t.tags.get("hyprun.why", ""),
            r.reason,
        )
        for t, r in zip(state.tests, rows, strict=True)
    ]
    facts = _facts(state, parent, diagnosis, rows)
    return Report(state.name, state.run_id, facts, tables, reasons, [r.primary for r in rows])


def _facts(state: State, parent, diagnosis: dict, rows: list[TestRow]) -> list[tuple[str, str]]:
    question = str(diagnosis.get("question", "?"))
    facts = [("Core question", f"{question}: {QUESTIONS.get(question, 'not triaged')}")]
    if parent.data.tags.get("hyprun.why"):
        facts.append(("Prompted by", parent.data.tags["hyprun.why"]))
    status = f"{state.strikes}/{STRIKES} strikes" + (" — escalated" if state.escalated else "")
    facts.append(("Status", status))
    if state.findings:
        top = [f"{rank}. {f['id']} ({f['cause']})" for rank, f in enumerate(state.findings, 1)]
        facts.append(("Triage's top findings", "; ".join(top)))
    if state.findings and state.tests:
        untested = [f"{f['id']} — first action: {f['first_action']}" for f in state.untested]
        facts.append(("Not tested yet", "; ".join(untested) or "every top finding was tested"))
    fixes = [f"H{t.number} {' '.join(t.fix)}" for t in state.confirmed]
    facts.append(("Confirmed", ", ".join(fixes) or "no hypothesis yet"))
    if state.baseline:
        base = state.baseline
        overrides = " ".join(base["overrides"]) or "defaults"
        seeds = f"{base['seeds']} seeds"
        if state.baseline_seeds > base["seeds"]:  # tests in rounds grew it
            seeds += f" (+{state.baseline_seeds - base['seeds']} added by tests' rounds)"
        by = f" · by {parent.data.tags['hyprun.user']}" if "hyprun.user" in parent.data.tags else ""
        facts.append(("Baseline", f"{overrides} · {seeds} · git {base['git_sha'][:10]}{by}"))
        if base.get("promoted_from"):
            facts.append(("Promoted from", base["promoted_from"]))
    metrics = parent.data.metrics
    noise = []
    for metric in NOISE:
        key = "baseline/" + metric.replace("/", "_")
        if f"{key}_mean" in metrics and f"{key}_std" in metrics:
            noise.append(f"{metric} {_num(metrics[f'{key}_mean'])} ± {_num(metrics[f'{key}_std'])}")
    if noise:
        facts.append(("Baseline seed mean ± std", "; ".join(noise)))
    spent = sum(r.spent for r in rows)
    saved = sum(r.saved for r in rows)
    added = sum(r.added for r in rows)
    also = f" (+{added:,} on baseline seeds added by rounds)" if added else ""
    facts.append(
        (
            f"{state.unit.capitalize()} on tests",
            f"{spent:,} spent{also}, {saved:,} saved by early stops and pruning",
        )
    )
    for reset in state.resets:
        facts.append(("Reset", f"by {reset['by']}: {reset['reason']}"))
    facts.append(("MLflow run", state.run_id))
    return facts


def _static_table(checks: list[dict]) -> Table:
    ordered = sorted(checks, key=lambda c: STATUS_ORDER.get(c.get("status"), 9))
    return Table(
        "L0 static checks",
        ["check", "status", "value", "threshold", "why"],
        [
            [
                c["id"],
                c["status"],
                _num(c.get("value")),
                str(c.get("threshold", "")),
                str(c.get("why", "")),
            ]
            for c in ordered
        ],
        empty="no static check recorded",
        intro="Config and a data sample, before training: failures first.",
    )


def _obvious_table(items: list[dict]) -> Table:
    return Table(
        "L1: the obvious first",
        ["check", "status", "details"],
        [[i["check"], i["status"], "; ".join(i.get("details", []))] for i in items],
        empty="not triaged",
        intro="From the baseline's seed 0.",
    )


def _findings_table(findings: list[dict]) -> Table:
    rows = [
        [
            str(rank),
            f"{f['id']} ({f.get('group', '')}, {f.get('question', '')})",
            "; also ".join([f.get("evidence", ""), *(a["evidence"] for a in f.get("also", []))]),
            _numbers(f.get("numbers", {})),
            f.get("cause", ""),
            f.get("first_action", ""),
            ", ".join(f.get("cards", [])),
        ]
        for rank, f in enumerate(findings, 1)
    ]
    return Table(
        "L1 findings, most likely first",
        ["#", "finding", "evidence", "numbers", "likely cause", "first action", "cards"],
        rows,
        empty="no pattern fired: no finding to test",
    )


def _features_table(features: dict[str, dict]) -> Table:
    """The features triage measured; `static.*` ones repeat the L0 table and are left out."""
    rows = [
        [name, _num(f.get("value")), f.get("detail", "")]
        for name, f in features.items()
        if f.get("value") is not None and not name.startswith("static.")
    ]
    return Table(
        "L1 evidence: measured features",
        ["feature", "value", "measured"],
        rows,
        empty="no feature measured",
    )


def _test_row(store: Store, test: Test, budget: int | None, state: State) -> TestRow:
    """One test's row: its verdict.json, its metrics and the tokens (or an app's steps) its
    seed jobs trained."""
    recorded = _verdict(store, test)
    verdict = {"unit": state.unit, **recorded} if recorded else {}
    shown = _effect(verdict, store.run(test.run_id).data.metrics) if verdict else "—"
    jobs = store.jobs_below(test.run_id)
    spent = sum(int(float(r.data.tags.get(f"hyprun.{state.unit}", 0))) for r in jobs)
    trials = max(1, len(verdict.get("trials", [])))
    seeds = int(test.tags.get("hyprun.seeds") or (state.baseline or {}).get("seeds", len(jobs)))
    # A sweep plans each trial at the baseline's seeds; only its best goes on in rounds.
    baseline_seeds = int((state.baseline or {}).get("seeds", seeds))
    planned = budget * (seeds + (trials - 1) * baseline_seeds) if budget else spent
    decided = test.verdict in ("confirmed", "rejected", "inconclusive")
    saved = max(0, planned - spent) if decided else 0
    delta = " ".join(test.delta) + (f" → {' '.join(test.fix)}" if test.fix != test.delta else "")
    if test.compound:
        delta += f" (compound: also {', '.join(test.compound)})"
    row = [
        f"H{test.number}",
        delta,
        test.verdict,
        shown,
        test.tags.get("hyprun.claimed") or "—",
        _measured(verdict),
        f"{spent:,}",
        f"{saved:,} ({saved / planned:.0%})" if planned else "0",
        test.seeds_shown or str(len(store.seed_runs(test.run_id)) or "—"),
        test.tags.get("hyprun.stopped") or ("rejected early" if verdict.get("early") else "—"),
    ]
    primary = verdict.get("metric") or "eval/loss"
    added = int(verdict.get("baseline_tokens_added") or 0)
    return TestRow(row, test.tags.get("hyprun.reason", ""), spent, saved, primary, added)


def _effect(verdict: dict[str, Any], metrics: dict[str, float]) -> str:
    """`eval/loss −3.2% ± 0.2% (better, 9.1σ)`: the number that decided the verdict (the
    primary's change, or a guard's that rejected it), as measured (diag/effect.py's one sign
    convention), then whether that is better for the metric and how many sigmas."""
    if verdict.get("noise") is None:  # older runs: the noise only as the test run's metric
        key = metric_key(verdict.get("metric") or "eval/loss")
        verdict = {**verdict, "noise": metrics.get(f"noise/{key}", metrics.get("noise"))}
    decided = deciding_guard(verdict) or verdict
    if change(decided) is None:
        return "—"  # nothing compared; `measured` says where it stopped
    return f"{describe(verdict)} ({_better(decided)})"


def _better(verdict: dict[str, Any]) -> str:
    """`better, 9.1σ`: the word from the improvement's sign (positive = better, whatever the
    metric's direction), so a verdict that stored its z another way still reads right."""
    effect, z = verdict.get("effect"), verdict.get("z")
    sign = effect if isinstance(effect, int | float) and effect == effect else z
    if verdict.get("early"):
        sign = -1.0  # early rejection stops only a worse test (older runs stored z > 0)
    if not isinstance(sign, int | float):
        return "no z"
    word = "better" if sign > 0 else "worse" if sign < 0 else "no change"
    return f"{word}, {abs(z):.1f}σ" if isinstance(z, int | float) else word


def _measured(verdict: dict[str, Any]) -> str:
    """The deciding metric on both sides at the matched tokens (an app's steps), or where an
    early stop fired."""
    unit = verdict.get("unit") or "tokens"
    if verdict.get("early"):
        return f"stopped at {verdict.get('tokens', 0):,} {unit} ({_better(verdict)})"
    decided = deciding_guard(verdict) or verdict
    if decided.get("baseline_value") is None or decided.get("test_value") is None:
        return "—"
    return (
        f"{decided.get('metric', '')} {_num(decided['baseline_value'])} → "
        f"{_num(decided['test_value'])} at {verdict.get('tokens', 0):,} {unit}"
    )


def _budget(store: Store, state: State) -> int | None:
    """Tokens one seed job may train (the baseline seed runs' `budget.tokens`)."""
    for run_id in (state.baseline or {}).get("seed_runs", []):
        value = store.run(run_id).data.params.get("budget.tokens")
        if value is not None:
            return int(float(value))
    return None


def _verdict(store: Store, test: Test) -> dict[str, Any]:
    if test.verdict in ("running", "refused", "error"):
        return {}
    return store.json_artifact(test.run_id, "verdict.json") or {}


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def _numbers(numbers: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_num(v)}" for k, v in numbers.items())


# ---------------------------------------------------------------------------------------- plots


PLOT_LIMIT = 1e30
"""Values beyond it (a diverging run: 1e300, inf, NaN) cannot be drawn beside a loss of 5 and
overflow the mean; they are left out of the plot. The hypothesis table has the numbers."""


def _band(store: Store, run_ids: list[str], metric: str):
    """(tokens, mean, low, high) over seeds at the token marks all seeds logged, drawable
    values only (a mark where a seed diverged ends the band)."""
    curves = [dict(store.history(r, metric)) for r in run_ids]
    curves = [c for c in curves if c]
    if not curves:
        return None
    marks = []
    for mark in sorted(set.intersection(*(set(c) for c in curves))):
        values = [c[mark] for c in curves]
        if not all(math.isfinite(v) and abs(v) < PLOT_LIMIT for v in values):
            break
        marks.append((mark, values))
    if not marks:
        return None
    return (
        [mark for mark, _ in marks],
        [statistics.fmean(values) for _, values in marks],
        [min(values) for _, values in marks],
        [max(values) for _, values in marks],
    )


def plot(store: Store, state: State, metric: str, path: Path) -> Path | None:
    """The baseline's seed band of `metric` and each test's seed mean (its own band faint)."""
    base = _band(store, state.baseline["seed_runs"], metric) if state.baseline else None
    if base is None:
        return None
    fig = Figure(figsize=(7, 4))  # no pyplot: no GUI backend, no global figure state
    ax = fig.subplots()
    marks, mean, low, high = base
    ax.fill_between(marks, low, high, alpha=0.25, color="gray", label="baseline seeds (min-max)")
    ax.plot(marks, mean, color="black", marker=".", label="baseline mean")
    for test in state.tests:
        runs = [r.info.run_id for r in store.seed_runs(test.evidence_run)]
        band = _band(store, runs, metric) if runs else None
        if band is not None:
            label = f"H{test.number} {' '.join(test.fix)} ({test.verdict})"
            (line,) = ax.plot(band[0], band[1], marker=".", label=label)
            ax.fill_between(band[0], band[2], band[3], alpha=0.1, color=line.get_color())
    if ax.get_ylim()[0] > 0 and ax.get_ylim()[1] > 1e3 * ax.get_ylim()[0]:
        ax.set_yscale("log")  # a test far off the baseline: both still readable
    ax.set_xlabel(f"{state.unit} seen" if state.unit == "tokens" else state.unit)
    ax.set_ylabel(metric)
    ax.set_title(f"{state.name}: {metric}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


# ------------------------------------------------------------------------------------ rendering


def render_markdown(report: Report) -> str:
    """The report as GitHub-flavoured Markdown, images linked beside it."""
    lines = [f"# Investigation {report.name}", ""]
    lines += [f"- **{label}**: {markdown.cell(value)}" for label, value in report.facts]
    for table in report.tables:
        lines += ["", f"## {table.title}", ""] + ([table.intro, ""] if table.intro else [])
        if not table.rows:
            lines.append(f"_{table.empty}_")
            continue
        rows = [[f"`{c}`" if i in table.code else c for i, c in enumerate(r)] for r in table.rows]
        lines += markdown.table(table.head, rows)
    if report.reasons:
        lines += ["", "### Why each test ran, and its verdict", ""]
        lines += [
            f"- **{test}**: {markdown.cell(why) or '—'} → {markdown.cell(reason) or '—'}"
            for test, why, reason in report.reasons
        ]
    lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in report.images]
    return "\n".join(lines) + "\n"


STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:4px 8px;
font-size:13px;text-align:left;vertical-align:top}th{background:#f4f4f4}code{font-size:12px}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 1em}dt{font-weight:bold}dd{margin:0}
.confirmed,.pass{color:#11702e;font-weight:bold}.rejected,.fail{color:#b3261e;font-weight:bold}
.inconclusive,.warn{color:#9a6700;font-weight:bold}figure{margin:0 0 1.5em}img{max-width:100%}"""

MLFLOW_IMAGES = """<script>
/* MLflow's artifact viewer loads this page from a blob: URL: fetch the plots from the server. */
if (location.protocol === "blob:") {
  const server = new URL(location.href.slice(5)).origin;
  for (const img of document.querySelectorAll("img[data-artifact]")) {
    img.src = server + "/get-artifact?path=" + encodeURIComponent(img.dataset.artifact)
      + "&run_uuid=" + encodeURIComponent(document.body.dataset.run);
  }
}
</script>"""


def render_html(report: Report) -> str:
    """The report as one HTML page; the plots are the PNG files beside it."""
    e = html.escape

    def cell(table: Table, i: int, value: str) -> str:
        text = f"<code>{e(value)}</code>" if i in table.code else e(value)
        status = f' class="{e(value)}"' if table.head[i] in ("verdict", "status") else ""
        return f"<td{status}>{text}</td>"

    parts = [f"<h1>Investigation {e(report.name)}</h1><dl>"]
    parts += [f"<dt>{e(label)}</dt><dd>{e(value)}</dd>" for label, value in report.facts]
    parts.append("</dl>")
    for table in report.tables:
        parts.append(
            f"<h2>{e(table.title)}</h2>" + (f"<p>{e(table.intro)}</p>" if table.intro else "")
        )
        if not table.rows:
            parts.append(f"<p><i>{e(table.empty)}</i></p>")
            continue
        head = "".join(f"<th>{e(h)}</th>" for h in table.head)
        body = "".join(
            "<tr>" + "".join(cell(table, i, c) for i, c in enumerate(row)) + "</tr>"
            for row in table.rows
        )
        parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    if report.reasons:
        parts.append("<h3>Why each test ran, and its verdict</h3><ul>")
        parts += [
            f"<li><b>{e(test)}</b>: {e(why) or '—'} → {e(reason) or '—'}</li>"
            for test, why, reason in report.reasons
        ]
        parts.append("</ul>")
    parts.append("<h2>Plots</h2>")
    parts += [
        f'<figure><img src="{e(p.name)}" alt="{e(p.stem)}" '
        f'data-artifact="{e(f"{ARTIFACT_DIR}/{p.name}")}"></figure>'
        for p in report.images
    ]
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>hyprun · {e(report.name)}</title><style>{STYLE}</style></head>"
        f'<body data-run="{e(report.run_id)}">\n'
        + "\n".join(parts)
        + "\n"
        + MLFLOW_IMAGES
        + "\n</body></html>\n"
    )
