"""`hyprun report`: an investigation as a Markdown file and an HTML page with PNG plots.

Both read offline (images are files beside them) and are logged on the parent run under
`report/`. Every plot is at matched tokens: the baseline's seeds as a band, each test's seed mean
as a line.
"""

from __future__ import annotations

import html
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from runner.investigation import State, Store  # noqa: E402

PLOTS = {  # metric -> file stem
    "eval/loss": "eval_loss",
    "train/loss": "train_loss",
    "grad/norm": "grad_norm",
    "perf/data_wait_frac": "data_wait",
}


def write_report(store: Store, state: State, out: Path) -> tuple[Path, Path]:
    """Write `report.md`, `report.html` and the plots into `out`; log them on the parent run."""
    out.mkdir(parents=True, exist_ok=True)
    diagnosis = _diagnosis(store, state)
    images = [
        p
        for metric, stem in PLOTS.items()
        if (p := _plot(store, state, metric, out / f"{stem}.png"))
    ]
    rows = [_row(t) for t in state.tests]
    markdown = _markdown(state, diagnosis, rows, images)
    page = _html(state, diagnosis, rows, images)
    (out / "report.md").write_text(markdown)
    (out / "report.html").write_text(page)
    for path in [out / "report.md", out / "report.html", *images]:
        store.client.log_artifact(state.run_id, str(path), "report")
    return out / "report.md", out / "report.html"


def _diagnosis(store: Store, state: State) -> dict:
    try:
        path = store.client.download_artifacts(state.run_id, "diagnosis.json")
    except Exception:  # a baseline recorded before triage existed
        return {"question": "?", "findings": [], "static": []}
    with open(path) as file:
        return json.load(file)


def _row(test) -> dict[str, str]:
    tags = test.tags
    return {
        "test": f"H{test.number}",
        "delta": " ".join(test.delta),
        "verdict": test.verdict,
        "measured": tags.get("hyprun.reason", ""),
        "claimed": tags.get("hyprun.claimed", ""),
        "why": tags.get("hyprun.why", ""),
    }


def _band(store: Store, run_ids: list[str], metric: str):
    """(tokens, mean, low, high) over seeds at the token marks all seeds logged."""
    curves = [dict(store.history(r, metric)) for r in run_ids]
    curves = [c for c in curves if c]
    if not curves:
        return None
    marks = sorted(set.intersection(*(set(c) for c in curves)))
    values = [[c[m] for c in curves] for m in marks]
    return (marks, [statistics.fmean(v) for v in values], [min(v) for v in values],
            [max(v) for v in values])  # fmt: skip


def _plot(store: Store, state: State, metric: str, path: Path) -> Path | None:
    base = _band(store, state.baseline["seed_runs"], metric) if state.baseline else None
    if base is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    marks, mean, low, high = base
    ax.fill_between(marks, low, high, alpha=0.25, color="gray", label="baseline seeds (min-max)")
    ax.plot(marks, mean, color="black", label="baseline mean")
    for test in state.tests:
        runs = [r.info.run_id for r in store.seed_runs(test.evidence_run)]
        band = _band(store, runs, metric) if runs else None
        if band is not None:
            ax.plot(
                band[0], band[1], label=f"H{test.number} {' '.join(test.delta)} ({test.verdict})"
            )
    ax.set_xlabel("tokens seen")
    ax.set_ylabel(metric)
    ax.set_title(f"{state.name}: {metric}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _markdown(state: State, diagnosis: dict, rows: list[dict], images: list[Path]) -> str:
    lines = [f"# Investigation {state.name}", "",
             f"Core question: **{diagnosis['question']}** · strikes {state.strikes}/3"
             + (" · **escalated**" if state.escalated else ""), ""]  # fmt: skip
    if state.baseline:
        base = state.baseline
        lines += [f"Baseline: `{' '.join(base['overrides']) or 'defaults'}`, "
                  f"{base['seeds']} seeds, git {base['git_sha'][:10]}", ""]  # fmt: skip
    failing = [c for c in diagnosis.get("static", []) if c["status"] in ("warn", "fail")]
    lines += ["## L0 checks that did not pass", "", "| check | status | value | threshold |",
              "| --- | --- | --- | --- |"]  # fmt: skip
    lines += [f"| {c['id']} | {c['status']} | {c['value']} | {c['threshold']} |" for c in failing]
    lines += ["", "## Findings", "", "| # | finding | cause | first action | numbers |",
              "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for i, f in enumerate(diagnosis["findings"], 1):
        numbers = ", ".join(f"{k}={v}" for k, v in f["numbers"].items())
        lines.append(f"| {i} | {f['id']} | {f['cause']} | {f['first_action']} | {numbers} |")
    lines += ["", "## Hypotheses", "", "| test | delta | verdict | measured | claimed |",
              "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['test']} | `{r['delta']}` | {r['verdict']} | {r['measured']} | "
                     f"{r['claimed']} |")  # fmt: skip
    lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images]
    return "\n".join(lines) + "\n"


def _html(state: State, diagnosis: dict, rows: list[dict], images: list[Path]) -> str:
    def table(head: list[str], body: list[list[str]]) -> str:
        cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        trs = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                      for row in body)  # fmt: skip
        return f"<table><tr>{cells}</tr>{trs}</table>"

    findings = [[f["id"], f["cause"], f["first_action"],
                 ", ".join(f"{k}={v}" for k, v in f["numbers"].items())]
                for f in diagnosis["findings"]]  # fmt: skip
    tests = [[r["test"], r["delta"], r["verdict"], r["measured"], r["claimed"]] for r in rows]
    escalated = " — escalated" if state.escalated else ""
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>hyprun · {html.escape(state.name)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px;
font-size:13px;text-align:left}}img{{max-width:100%}}</style></head><body>
<h1>Investigation {html.escape(state.name)}</h1>
<p>Core question: <b>{html.escape(str(diagnosis["question"]))}</b> · strikes {state.strikes}/3
{escalated}</p>
<h2>Findings</h2>{table(["finding", "cause", "first action", "numbers"], findings)}
<h2>Hypotheses</h2>{table(["test", "delta", "verdict", "measured", "claimed"], tests)}
<h2>Plots</h2>{"".join(f'<img src="{p.name}" alt="{p.stem}">' for p in images)}
</body></html>
"""
