"""`hyprun report` on an investigation written straight into MLflow (no training): every section,
the hypothesis table's numbers for a plain, an early-rejected, a swept and a running test, the
plots, escaping, and a baseline recorded before triage existed."""

from __future__ import annotations

import getpass
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param

from hyprun.runner.cli.report import write_report
from hyprun.runner.store.investigation import State, Store, baseline_seed_key

BUDGET = 4096
MARKS = (1024, 2048, 3072, 4096)
WHY = 'I think <b>the LR</b> is "off" | because & flat'
DIAGNOSIS = {
    "run_id": "seed0",
    "question": "Q1",
    "obvious": [
        {
            "check": "Is the learning rate reasonable?",
            "status": "warn",
            "details": ["lr <= 1e-4: low (config optim.lr 1e-05)"],
        }
    ],
    "findings": [
        {
            "id": "loss_flat",
            "question": "Q1",
            "group": "training dynamics",
            "evidence": "train loss barely falls",
            "cause": "LR <too> low",
            "first_action": "raise optim.lr",
            "cards": ["lr_up"],
            "numbers": {"loss_rel_drop": 0.0123456},
            "details": [],
        }
    ],
    "features": {
        "loss_rel_drop": {"value": 0.0123456, "detail": "dropped 1.2%"},
        "static.lr_plausible": {"value": 1e-5, "detail": "repeats L0"},
        "nan_module": {"value": None, "detail": "none"},
    },
    "static": [
        {"id": "lr_plausible", "status": "pass", "value": 1e-5, "threshold": "0 < lr", "why": "ok"},
        {
            "id": "warmup",
            "status": "fail",
            "value": 0.0,
            "threshold": "warmup_frac > 0",
            "why": "no warmup",
        },
    ],
}


class Page(HTMLParser):
    """The images and table rows of an HTML page, and whether any tag was left open."""

    def __init__(self, text: str):
        super().__init__()
        self.images: list[str] = []
        self.rows: list[list[str]] = []
        self.open: list[str] = []
        self.scripts = 0
        self.feed(text)

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        elif tag == "tr":
            self.rows.append([])
        elif tag == "td":
            self.rows[-1].append("")
        self.scripts += tag == "script"
        if tag not in ("img", "meta"):
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open.pop() == tag, f"</{tag}> closes something else"

    def handle_data(self, data: str) -> None:
        if self.open and self.open[-1] in ("td", "code") and self.rows:
            self.rows[-1][-1] += data


def seed_run(
    store: Store,
    parent: str,
    seed: int,
    level: float,
    tokens: int = BUDGET,
    primary: str | None = None,
) -> str:
    """A finished seed job below `parent` whose metrics fall from `level`."""
    run = store.child(parent, f"seed {seed}", {"hyprun.seed": str(seed), "hyprun.tokens": tokens})
    metrics = [
        Metric(name, level - 0.1 * i + 0.01 * seed, 0, mark)
        for name in (
            "eval/loss",
            "train/loss",
            "grad/norm",
            "perf/data_wait_frac",
            *([primary] if primary else []),
        )
        for i, mark in enumerate(m for m in MARKS if m <= tokens)
    ]
    store.client.log_batch(run, metrics=metrics, params=[Param("budget.tokens", str(BUDGET))])
    store.finish(run)
    return run


def add_test(
    store: Store,
    parent: str,
    number: int,
    delta: list[str],
    verdict: dict | None,
    tags: dict | None = None,
) -> str:
    """A test run as the controller leaves it: tags, metrics and verdict.json."""
    status = verdict["status"] if verdict else "running"
    run = store.child(
        parent,
        f"H{number} · {status}",
        {
            "hyprun.role": "test",
            "hyprun.investigation": "inv",
            "hyprun.number": str(number),
            "hyprun.delta": json.dumps(delta),
            "hyprun.verdict": status,
            "hyprun.why": WHY,
            "hyprun.claimed_ms": str(1000 + number),
            **(tags or {}),
        },
    )
    assert store.once(parent, f"test.H{number}", run)
    if verdict:
        store.tag(run, {"hyprun.reason": verdict["reason"]})
        store.metrics(run, {k: verdict[k] for k in ("effect", "noise") if verdict.get(k)})
        store.text(run, json.dumps(verdict), "verdict.json")
    return run


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, State, Path]:
    """(store, state, report folder) of a baseline of 2 seeds and four tests: confirmed with a
    card's claim, rejected early, a sweep whose best trial is confirmed, and one still running;
    its report written once."""
    folder = tmp_path_factory.mktemp("report")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)  # a sqlite store keeps its artifacts in ./mlruns
        return _investigation(Store(f"sqlite:///{folder}/mlflow.db", "hyprun"), folder / "out")


def _investigation(store: Store, out: Path) -> tuple[Store, State, Path]:
    """Record the investigation in `store`, then write its report into `out`."""
    parent = store.create("inv", "note")
    seeds = [seed_run(store, parent, s, 5.5, primary="perf/tokens_per_s") for s in (0, 1)]
    store.tag(
        parent,
        {
            "hyprun.why": "loss <flat> since step 0",
            "hyprun.baseline": json.dumps(
                {
                    "overrides": ["optim.lr=1e-5"],
                    "seeds": 2,
                    "git_sha": "abc123def4567",
                    "config_hash": "x",
                    "seed_runs": seeds,
                }
            ),
        },
    )
    store.metrics(parent, {"baseline/eval_loss_mean": 5.2, "baseline/eval_loss_std": 0.01})
    store.text(parent, json.dumps(DIAGNOSIS), "diagnosis.json")

    h1 = add_test(
        store,
        parent,
        1,
        ["ds=fp16"],
        {
            "status": "confirmed",
            "reason": "faster",
            "effect": 0.024,
            "noise": 0.003,
            "z": 8.0,
            "metric": "perf/tokens_per_s",
            "baseline_value": 100.0,
            "test_value": 124.0,
            "tokens": 4096,
            "baseline_tokens_added": 4096,  # its rounds added baseline seed 2
        },
        {
            "hyprun.claimed": "25% faster",
            "hyprun.card": "fp16",
            "hyprun.seeds": "2",
            "hyprun.stopped": "decided in round 1",
        },
    )
    for seed in (0, 1):
        seed_run(store, h1, seed, 5.0, primary="perf/tokens_per_s")
    added = seed_run(store, parent, 2, 5.5, primary="perf/tokens_per_s")
    assert store.once(parent, baseline_seed_key("x", 2), added)
    early = {  # as early rejection stored it: z > 0 counted sigmas worse
        "status": "rejected",
        "early": True,
        "reason": "rejected early: worse",
        "metric": "eval/loss",
        "effect": -0.11,
        "noise": 0.0056,
        "z": 20.5,
        "baseline_value": 5.2,
        "test_value": 5.772,
        "tokens": 2048,
    }
    stopped = {"hyprun.seeds": "2", "hyprun.seeds_run": "1", "hyprun.stopped": "rejected early"}
    h2 = add_test(store, parent, 2, ["optim.lr=1e-7"], early, stopped)
    seed_run(store, h2, 0, 5.9, tokens=2048)
    h3 = add_test(store, parent, 3, ["optim.lr=choice(1e-4, 3e-3)"], None)
    trials = [store.child(h3, f"H3.{t}", {"hyprun.role": "trial"}) for t in (0, 1)]
    seed_run(store, trials[0], 0, 5.9, tokens=1024)  # pruned after its first eval
    for seed in (0, 1):  # the best trial ran out
        seed_run(store, trials[1], seed, 4.9)
    store.tag(
        h3,
        {
            "hyprun.verdict": "confirmed",
            "hyprun.reason": "best optim.lr=0.003",
            "hyprun.best_delta": json.dumps(["optim.lr=0.003"]),
            "hyprun.best_run": trials[1],
        },
    )
    store.metrics(h3, {"effect/eval_loss": -0.05, "noise/eval_loss": 0.01})
    swept = {
        "status": "confirmed",
        "metric": "eval/loss",
        "z": 5.0,
        "baseline_value": 5.2,
        "test_value": 4.94,
        "tokens": 4096,
        "trials": [{}, {}],
    }
    store.text(h3, json.dumps(swept), "verdict.json")
    add_test(store, parent, 4, ["model.norm=rmsnorm"], None)
    guarded = {  # demo H3: faster within its noise, rejected for its eval/loss regression
        "status": "rejected",
        "reason": "guard eval/loss regressed",
        "metric": "perf/tokens_per_s",
        "effect": 0.355,
        "noise": 0.13,
        "z": 2.8,
        "baseline_value": 19360.0,
        "test_value": 26236.0,
        "tokens": 4096,
        "guards": [
            {
                "metric": "eval/loss",
                "direction": "min",
                "baseline": 4.839,
                "test": 5.043,
                "effect": -0.042,
                "noise": 0.0037,
                "z": -11.5,
                "regressed": True,
            }
        ],
    }
    h5 = add_test(store, parent, 5, ["ds.micro_batch=32"], guarded, {"hyprun.seeds": "2"})
    for seed in (0, 1):
        seed_run(store, h5, seed, 5.6)
    state = store.find("inv")
    write_report(store, state, out)
    return store, state, out


def test_the_report_holds_every_section_with_the_tests_numbers(report):
    store, state, out = report
    md = (out / "report.md").read_text()

    assert "- **Core question**: Q1: why isn't it converging?" in md
    assert "- **Prompted by**: loss <flat> since step 0" in md
    assert "- **Confirmed**: H1 ds=fp16, H3 optim.lr=0.003" in md
    assert "- **Baseline seed mean ± std**: eval/loss 5.2 ± 0.01" in md
    assert md.index("| warmup | fail |") < md.index("| lr_plausible | pass |")  # failures first
    assert "| Is the learning rate reasonable? | warn | lr <= 1e-4: low" in md
    assert (
        "| 1 | loss_flat (training dynamics, Q1) | train loss barely falls | "
        "loss_rel_drop=0.01235 | LR <too> low | raise optim.lr | lr_up |" in md
    )
    assert "| loss_rel_drop | 0.01235 | dropped 1.2% |" in md
    assert "static.lr_plausible" not in md and "nan_module" not in md

    rows = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| H")}
    assert rows["| H1"] == (
        "| H1 | `ds=fp16` | confirmed | perf/tokens_per_s +24% ± 0.3% (better, 8.0σ) | "
        "25% faster | perf/tokens_per_s 100 → 124 at 4,096 tokens | 8,192 | "
        "0 (0%) | 2 | decided in round 1 |"
    )
    # Early rejection: worse, on the one seed it ran (of the 2 planned), not "better" x 2 seeds.
    assert rows["| H2"] == (
        "| H2 | `optim.lr=1e-7` | rejected | eval/loss +11% ± 0.56% (worse, 20.5σ) | — | "
        "stopped at 2,048 tokens (worse, 20.5σ) | 2,048 | 6,144 (75%) | 1 of 2 | rejected early |"
    )
    # A sweep of 2 trials x 2 seeds: one trial pruned after 1,024 tokens, the best ran out.
    assert rows["| H3"].startswith(
        "| H3 | `optim.lr=choice(1e-4, 3e-3) → optim.lr=0.003` | "
        "confirmed | eval/loss \u22125% ± 1% (better, 5.0σ) |"
    )
    assert rows["| H3"].endswith("| 9,216 | 7,168 (44%) | — | — |")
    assert rows["| H4"] == (
        "| H4 | `model.norm=rmsnorm` | running | — | — | — | 0 | 0 (0%) | — | — |"
    )
    # A guard's rejection is named by the guard's number, which decided it.
    assert rows["| H5"] == (
        "| H5 | `ds.micro_batch=32` | rejected | guard eval/loss +4.2% ± 0.37% (worse, 11.5σ) | "
        "— | eval/loss 4.839 → 5.043 at 4,096 tokens | 8,192 | 0 (0%) | 2 | — |"
    )
    assert "- **Baseline**: optim.lr=1e-5 · 2 seeds (+1 added by tests' rounds) · git" in md
    assert (
        "- **Tokens on tests**: 27,648 spent (+4,096 on baseline seeds added by rounds), "
        "13,312 saved" in md
    )
    by = getpass.getuser()  # hyprun.user: the login name on a store without accounts
    assert (
        f'- **H2 (by {by})**: I think <b>the LR</b> is "off" \\| because & flat → rejected early'
        in md
    )

    images = sorted(p.name for p in out.glob("*.png"))
    assert images == [
        "data_wait.png",
        "eval_loss.png",
        "grad_norm.png",
        "perf_tokens_per_s.png",
        "train_loss.png",
    ]
    assert all(f"![{Path(i).stem}]({i})" in md for i in images)
    logged = {a.path for a in store.client.list_artifacts(state.run_id, "report")}
    assert logged == {f"report/{name}" for name in [*images, "report.md", "report.html"]}


def test_the_html_page_is_escaped_and_self_contained(report):
    _, _, out = report
    text = (out / "report.html").read_text()
    parsed = Page(text)  # raises if a tag closes out of order
    assert parsed.scripts == 1, "only the report's own script: nothing from the data runs"
    assert "&lt;b&gt;the LR&lt;/b&gt; is &quot;off&quot; | because &amp; flat" in text
    assert "LR &lt;too&gt; low" in text and "<too>" not in text
    assert sorted(parsed.images) == sorted(p.name for p in out.glob("*.png"))
    assert all((out / src).is_file() for src in parsed.images)  # relative paths, beside it
    assert "http" not in "".join(parsed.images)
    cells = {r[0]: r for r in parsed.rows if r and r[0].startswith("H")}
    assert [cells[f"H{n}"][2] for n in (1, 2, 3, 4, 5)] == [
        "confirmed",
        "rejected",
        "confirmed",
        "running",
        "rejected",
    ]
    assert 'class="confirmed"' in text and 'class="fail"' in text


def test_a_baseline_recorded_before_triage_still_reports(workdir):
    store = Store(f"sqlite:///{workdir}/mlflow.db", "hyprun")
    parent = store.create("old", "note")
    seeds = [seed_run(store, parent, s, 5.5) for s in (0, 1)]
    store.tag(
        parent,
        {
            "hyprun.baseline": json.dumps(
                {
                    "overrides": [],
                    "seeds": 2,
                    "git_sha": "0" * 40,
                    "config_hash": "x",
                    "seed_runs": seeds,
                }
            )
        },
    )
    markdown, page = write_report(store, store.find("old"), workdir / "out")
    md = markdown.read_text()
    assert "- **Core question**: ?: not triaged" in md and "defaults · 2 seeds" in md
    assert "_no static check recorded_" in md and "_no hypothesis tested yet_" in md
    assert (workdir / "out" / "eval_loss.png").is_file()
    Page(page.read_text())


def diverging_seed(store: Store, parent: str, seed: int, values: list[float]) -> str:
    """A seed job whose eval/loss takes `values` at the token marks (1e300, inf, NaN...)."""
    run = store.child(parent, f"seed {seed}", {"hyprun.seed": str(seed), "hyprun.tokens": BUDGET})
    metrics = [Metric("eval/loss", v, 0, mark) for v, mark in zip(values, MARKS, strict=False)]
    store.client.log_batch(run, metrics=metrics, params=[Param("budget.tokens", str(BUDGET))])
    store.finish(run, "FAILED")
    return run


def test_any_investigation_renders(workdir):
    """Empty, diverged (huge, inf and NaN values: the fsum overflow of issue 12), compound,
    escalated and reset investigations all render, with every image loaded."""
    store = Store(f"sqlite:///{workdir}/mlflow.db", "hyprun")
    store.create("empty", "a baseline that never recorded")
    markdown, _ = write_report(store, store.find("empty"), workdir / "empty")
    assert "_no hypothesis tested yet_" in markdown.read_text()

    parent = store.create("inv", "note")
    seeds = [seed_run(store, parent, s, 5.5) for s in (0, 1)]
    baseline = {"overrides": [], "seeds": 2, "git_sha": "0" * 40, "config_hash": "x"}
    store.tag(parent, {"hyprun.baseline": json.dumps({**baseline, "seed_runs": seeds})})
    diverged = {"status": "rejected", "reason": "diverged", "effect": None, "noise": None}
    huge = [[5.4, 1.7e308, 1.7e308], [5.4, float("inf"), float("nan")]]
    for number, values in enumerate(huge, start=1):
        run = add_test(store, parent, number, [f"optim.lr={30 * number}"], diverged)
        store.tag(run, {"hyprun.strike": "true"})
        store.metrics(run, {"effect": float("nan"), "noise": float("nan")})
        for seed in (0, 1):
            diverging_seed(store, run, seed, values)
    compound = add_test(
        store, parent, 3, ["sched=cosine_warm_restarts"], diverged, {"hyprun.strike": "true"}
    )
    store.tag(compound, {"hyprun.compound": "sched.min_lr_ratio,sched.warmup_frac"})
    seed_run(store, compound, 0, 1e12)  # finite but far off: a log scale keeps both readable
    state = store.find("inv")
    assert state.escalated and state.strikes == 3
    markdown, page = write_report(store, state, workdir / "escalated")
    text = markdown.read_text()
    assert "3/3 strikes — escalated" in text
    assert "(compound: also sched.min_lr_ratio, sched.warmup_frac)" in text
    assert "| H1 | `optim.lr=30` | rejected | — |" in text, text  # no effect to show: a dash
    assert "nan" not in text.lower().replace("nano", "")
    Page(page.read_text())
    assert (workdir / "escalated" / "eval_loss.png").is_file()

    store.tag(
        parent,
        {
            "hyprun.reset.9999999999999": json.dumps(
                {"by": "ana", "reason": "go", "time": 9999999999999}
            )
        },
    )
    state = store.find("inv")
    assert state.strikes == 0 and not state.escalated
    markdown, _ = write_report(store, state, workdir / "reset")
    assert "Reset**: by ana: go" in markdown.read_text()


def test_an_apps_eval_loss_beside_our_eval_loss_is_two_plots_each_listed_once(workdir):
    """An HF Trainer logs `eval_loss` (its declared metric) where our probe logs `eval/loss`:
    two metrics, two files, each listed once (they shared eval_loss.png, listed twice)."""
    store = Store(f"sqlite:///{workdir}/mlflow.db", "hyprun")
    parent = store.create("hf", "note")
    seeds = [seed_run(store, parent, s, 5.5, primary="eval_loss") for s in (0, 1)]
    baseline = {"overrides": [], "seeds": 2, "git_sha": "0" * 40, "config_hash": "x"}
    store.tag(parent, {"hyprun.baseline": json.dumps({**baseline, "seed_runs": seeds})})
    verdict = {"status": "confirmed", "reason": "lower", "metric": "eval_loss", "z": 5.0}
    run = add_test(store, parent, 1, ["optim.lr=3e-3"], verdict)
    for seed in (0, 1):
        seed_run(store, run, seed, 5.0, primary="eval_loss")
    markdown, _ = write_report(store, store.find("hf"), workdir / "out")
    plots = [line for line in markdown.read_text().splitlines() if line.startswith("![")]
    assert len(plots) == len(set(plots)) and "![eval_loss_2](eval_loss_2.png)" in plots, plots
    assert (workdir / "out" / "eval_loss_2.png").is_file()
