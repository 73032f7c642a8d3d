"""The evidence in a real browser: an investigation recorded on a real `mlflow server`, its runs and
verdict tags in the MLflow UI, its report rendered in MLflow's artifact viewer and from disk.

One small investigation (a baseline of 2 seeds, one test that is confirmed, one that is rejected)
runs in this process against the server; headless Chromium then looks at it. Every page visited is
saved as a screenshot (set HYPRUN_SCREENSHOTS=DIR to keep copies).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from hyprun.runner.cli.report import write_report
from hyprun.runner.control import controller
from hyprun.runner.control.baseline import record_baseline
from hyprun.runner.store.investigation import CURVES, Store, links
from tests.e2e import browser

NAME = "in-a-browser"
EXPERIMENT = "browser"
BUDGET = ["budget.tokens=4096", "budget.eval_every_tokens=1024", "budget.eval_sequences=16"]
WHY = "I think the LR is off because the loss falls slowly"
TESTS = {"optim.lr=3e-3": "confirmed", "optim.lr=1e-7": "rejected"}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def investigation(mlflow_server: str, tmp_path_factory: pytest.TempPathFactory):
    """(store, state, report folder) of an investigation recorded on the server."""
    folder = tmp_path_factory.mktemp("investigation")
    store = Store(mlflow_server, EXPERIMENT)
    overrides = [*BUDGET, f"tracking.uri={mlflow_server}", f"checkpoint.dir={folder}/ckpt"]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        record_baseline(store, NAME, overrides, seeds=2, why="the loss falls slowly")
        for delta, expected in TESTS.items():
            outcome = controller.test(store, NAME, [delta], WHY, max_seeds=2)  # one look
            assert outcome.verdict["status"] == expected, outcome.verdict
        state = store.find(NAME)
        write_report(store, state, folder / "report")
    return store, state, folder / "report"


@pytest.fixture(scope="module")
def screens(tmp_path_factory: pytest.TempPathFactory):
    """Saves screenshots into a temporary folder, and into HYPRUN_SCREENSHOTS when it is set."""
    folder = tmp_path_factory.mktemp("screens")
    keep = Path(os.environ["HYPRUN_SCREENSHOTS"]) if os.environ.get("HYPRUN_SCREENSHOTS") else None
    taken: list[Path] = []

    def take(driver, name: str, full_page: bool = False) -> Path:
        path = browser.screenshot(driver, folder, name, keep, full_page)
        taken.append(path)
        return path

    yield take
    assert all(browser.is_png(p) for p in taken), taken


@pytest.fixture(scope="module")
def mlflow_ui(chromium, investigation, mlflow_server) -> browser.MlflowUI:
    """The MLflow UI of the investigation's experiment."""
    store, _, _ = investigation
    experiment = store.client.get_experiment_by_name(EXPERIMENT).experiment_id
    return browser.MlflowUI(chromium, mlflow_server, experiment)


@pytest.fixture(scope="module")
def run_names(investigation) -> dict[str, str]:
    """{verdict: run name} of the two tests; a test's run is named with its verdict."""
    store, state, _ = investigation
    return {t.verdict: store.client.get_run(t.run_id).info.run_name for t in state.tests}


def flat(text: str) -> str:
    """Text with its whitespace runs as single spaces (the UI splits tags over lines)."""
    return re.sub(r"\s+", " ", text)


def test_report_html_renders_offline_with_every_image(chromium, investigation, screens):
    _, state, folder = investigation
    pngs = sorted(p.name for p in folder.glob("*.png"))
    assert {"eval_loss.png", "grad_norm.png", "data_wait.png"} <= set(pngs)
    chromium.get((folder / "report.html").as_uri())
    text = browser.wait_for_text(chromium, f"Investigation {NAME}", "Hypotheses")
    browser.wait_for(lambda: not browser.broken_images(chromium), 15, "every image loaded")
    assert browser.image_count(chromium) == len(pngs)
    sources = chromium.execute_script("return Array.from(document.images).map(i => i.src);")
    assert all(s.startswith("file://") for s in sources), sources  # nothing from the network
    rows = chromium.execute_script(
        "return Array.from(document.querySelectorAll('tbody tr'))"
        ".map(r => Array.from(r.cells).map(c => c.innerText));"
    )
    hypotheses = {r[0]: r for r in rows if re.fullmatch(r"H\d+", r[0])}
    assert [hypotheses[f"H{t.number}"][2] for t in state.tests] == list(TESTS.values())
    assert hypotheses["H1"][1] == "optim.lr=3e-3" and "%" in hypotheses["H1"][3]
    assert "L0 static checks" in text and "L1 evidence" in text
    screens(chromium, "report-offline", full_page=True)


def test_runs_table_lists_the_investigation_and_finds_tests_by_verdict(
    mlflow_ui, run_names, screens
):
    assert " · confirmed · eval/loss \u2212" in run_names["confirmed"], run_names
    assert " · rejected · " in run_names["rejected"], run_names
    mine = f"tags.`hyprun.investigation` = '{NAME}'"
    text = mlflow_ui.runs(mine, NAME, *run_names.values())
    assert text.count("baseline · seed") == 2, text
    screens(mlflow_ui.driver, "runs-table")
    for verdict, name in run_names.items():  # MLflow's own search finds each test by its tag
        text = mlflow_ui.runs(f"{mine} and tags.`hyprun.verdict` = '{verdict}'", NAME, name)
        assert not any(n in text for v, n in run_names.items() if v != verdict), text
        screens(mlflow_ui.driver, f"runs-table-{verdict}")


def test_run_pages_show_the_tests_and_their_verdict_tags(
    mlflow_ui, investigation, run_names, screens
):
    _, state, _ = investigation
    mlflow_ui.open(f"/runs/{state.run_id}")
    browser.wait_for_text(mlflow_ui.driver, "Child runs", *run_names.values())
    screens(mlflow_ui.driver, "parent-run")
    for test in state.tests:
        mlflow_ui.open(f"/runs/{test.run_id}")
        tag = f"hyprun.verdict : {test.verdict}"  # the UI sets the tag's key and value apart
        browser.wait_for(lambda tag=tag: tag in flat(browser.page_text(mlflow_ui.driver)), 30, tag)
        screens(mlflow_ui.driver, f"test-run-H{test.number}-{test.verdict}")


def test_report_renders_in_the_artifact_viewer_with_its_plots(mlflow_ui, investigation, screens):
    _, state, _ = investigation
    driver = mlflow_ui.driver
    mlflow_ui.open(f"/runs/{state.run_id}/artifacts/report/report.html")
    frame = browser.wait_for(mlflow_ui.html_frame, 30, "the artifact viewer's frame")
    driver.switch_to.frame(frame)
    try:
        text = browser.wait_for_text(driver, f"Investigation {NAME}", "Hypotheses")
        assert all(verdict in text for verdict in TESTS.values())
        browser.wait_for(
            lambda: browser.image_count(driver) >= 4 and not browser.broken_images(driver),
            30,
            "the report's plots loaded inside MLflow's viewer",
        )
    finally:
        driver.switch_to.default_content()
    screens(driver, "artifact-report-html")
    driver.switch_to.frame(frame)
    try:  # and its plots, scrolled to
        driver.execute_script("document.images[0].scrollIntoView();")
        browser.wait_for(lambda: driver.execute_script("return window.scrollY > 0;"), 5, "scroll")
    finally:
        driver.switch_to.default_content()
    screens(driver, "artifact-report-html-plots")

    browser.wait_for(lambda: mlflow_ui.tree_entry("eval_loss.png"), 10, "eval_loss.png").click()
    browser.wait_for(
        lambda: driver.execute_script(
            "return Array.from(document.images).some(i => i.alt === 'report/eval_loss.png'"
            " && i.complete && i.naturalWidth > 0);"
        ),
        30,
        "eval_loss.png in MLflow's image viewer",
    )
    screens(driver, "artifact-eval-loss-png")


def test_from_the_home_page_the_switch_decides_genai_overview_or_runs(
    mlflow_ui, investigation, run_names, screens
):
    """MLflow 3.17 opens an experiment on the GenAI overview unless the sidebar's workflow
    switch says Model training (the README says to switch once; the browser remembers it)."""
    _, state, _ = investigation
    driver = mlflow_ui.driver
    mlflow_ui.home(forget=True)  # a first visit: nothing remembered
    mlflow_ui.experiment_link(EXPERIMENT).click()
    browser.wait_for(lambda: "/overview" in driver.current_url, 30, "the GenAI overview")
    screens(driver, "home-click-genai-overview")

    mlflow_ui.home()
    mlflow_ui.workflow_switch("Model training")
    mlflow_ui.experiment_link(EXPERIMENT).click()
    browser.wait_for(lambda: "/runs" in driver.current_url, 30, "the runs table")
    parent = store_run_name(investigation, state.run_id)
    assert parent.startswith(f"{NAME} · fixed by H1 optim.lr=3e-3 (eval/loss \u2212"), parent
    browser.wait_for_text(driver, parent)  # the outcome at a glance, on the top-level row
    mlflow_ui.close_assistant()
    wait_expander = browser.wait_for(mlflow_ui.expander, 30, "the investigation's expander")
    wait_expander.click()
    mlflow_ui.widen_run_names()
    text = browser.wait_for_text(driver, *run_names.values())  # no column added
    assert "baseline · seed 0" in text
    screens(driver, "home-model-training-runs")


def test_the_printed_links_open_the_tests_and_their_seed_bands(
    mlflow_ui, investigation, run_names, screens
):
    store, state, _ = investigation
    driver = mlflow_ui.driver
    found = links(store, state)
    mlflow_ui.home(forget=True)  # the links work in a browser that remembers nothing
    driver.get(found.runs)
    text = browser.wait_for_text(driver, "Group: test", *run_names.values())
    assert "/runs" in driver.current_url
    confirmed = run_names["confirmed"]
    assert re.search(r"eval/loss \u2212[\d.]+% ± [\d.]+%$", confirmed), confirmed
    assert text.count("baseline · seed") == 2
    mlflow_ui.close_assistant()
    screens(driver, "link-runs-by-role")

    driver.get("about:blank")
    driver.get(found.compare)
    section = "hyprun: baseline vs tests (seed mean and range)"
    sides = ["baseline", *(f"H{t.number} {t.verdict}" for t in state.tests)]
    legend = [f"{side} (eval/loss)" for side in sides]
    text = browser.wait_for_text(driver, section, "Group: baseline", *legend, timeout=60)
    assert text.index(section) < text.index("act/rms")  # our charts first
    mlflow_ui.close_assistant()
    # Every side fits MLflow's two-line legend (full run names took a line each: cut after H1)
    shown = driver.execute_script(LEGEND_ENTRIES_SHOWN, "(eval/loss)")
    assert all(shown.get(entry) for entry in legend), shown
    # The y axes fit the curves (MLflow's own range starts at 0: losses of 4.4-5.5 in a strip);
    # MLflow draws a chart once it is scrolled into view: eval/loss, the first, is
    ticks = driver.execute_script(LOWEST_Y_TICKS, len(CURVES))
    assert ticks and all(tick > 0 for tick in ticks), ticks
    screens(driver, "link-compare-seed-bands")


LEGEND_ENTRIES_SHOWN = """
const entries = Array.from(document.querySelectorAll('span'))
  .filter(e => e.children.length === 0 && e.textContent.trim().endsWith(arguments[0]));
return Object.fromEntries(entries.map(label => {
  const item = label.parentElement, box = item.parentElement.getBoundingClientRect();
  const bottom = item.getBoundingClientRect().bottom;
  return [label.textContent.trim(), bottom <= box.bottom + 1 && bottom > box.top];
}));
"""
LOWEST_Y_TICKS = """
return Array.from(document.querySelectorAll('.js-plotly-plot')).slice(0, arguments[0])
  .map(plot => Math.min(...Array.from(plot.querySelectorAll('.ytick text'))
    .map(t => parseFloat(t.textContent.replace('\u2212', '-')))));
"""


def store_run_name(investigation, run_id: str) -> str:
    store, _, _ = investigation
    return store.client.get_run(run_id).info.run_name
