"""Headless Chromium through Selenium and Debian's chromedriver, for the browser tests.

No Selenium Manager and no browser download: the binaries are the ones
tests/e2e/install_chromium.sh installs. Chromium runs with a fresh profile and with its
background networking off (update checks, sync, component downloads), which on a closed network
would only retry forever.
"""

from __future__ import annotations

import base64
import importlib.util
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote, urlencode

try:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
except ImportError:  # `missing()` says so, and the `chromium` fixture skips or fails
    ActionChains = By = None

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--window-size=1600,1000",
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T = TypeVar("T")


def missing() -> str | None:
    """Why a browser cannot start here, or None when it can."""
    absent = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if absent:
        return f"{', '.join(absent)} missing: run tests/e2e/install_chromium.sh"
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed: pip install -e '.[dev]'"
    return None


def start(profile: Path):
    """A headless Chromium with a fresh profile in `profile`."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    return driver


def wait_for(condition: Callable[[], T], timeout: float = 30, what: str = "condition") -> T:
    """Poll `condition` until it returns something truthy; its exceptions count as not yet."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception as error:  # the page is still rendering: elements come and go
            last, value = error, None
        if value:
            return value
        time.sleep(0.25)
    raise TimeoutError(f"{what} not met within {timeout:.0f} s" + (f" ({last})" if last else ""))


def page_text(driver) -> str:
    """The visible text of the current page (or frame)."""
    return driver.find_element(By.TAG_NAME, "body").text


def wait_for_text(driver, *texts: str, timeout: float = 30) -> str:
    """Wait until every one of `texts` is visible on the page; returns the page's text."""

    def shown() -> str | None:
        text = page_text(driver)
        return text if all(t in text for t in texts) else None

    return wait_for(shown, timeout, f"text {texts!r} on {driver.current_url}")


def broken_images(driver) -> list[str]:
    """The <img> elements of the current page or frame that did not load (naturalWidth 0)."""
    return driver.execute_script(
        "return Array.from(document.images)"
        ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src);"
    )


def image_count(driver) -> int:
    """How many <img> elements the current page or frame has."""
    return driver.execute_script("return document.images.length;")


def screenshot(
    driver, folder: Path, name: str, copy_to: Path | None = None, full_page: bool = False
) -> Path:
    """Save a PNG of the viewport (or of the whole page) as `folder/name.png`, and copy it
    into `copy_to`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    if full_page:  # Chromium's own capture, beyond the window
        size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = driver.execute_cdp_cmd(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
        )
        path.write_bytes(base64.b64decode(shot["data"]))
    else:
        assert driver.save_screenshot(str(path)), f"no screenshot {path}"
    if copy_to is not None:
        copy_to.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, copy_to / path.name)
    return path


def is_png(path: Path) -> bool:
    """A non-empty PNG file (signature checked)."""
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG_MAGIC)


FORGET_TABLE_STATE = """for (const key of Object.keys(localStorage)) {
  if (key.includes("ExperimentPage")) localStorage.removeItem(key);
}"""


class MlflowUI:
    """The MLflow UI of one experiment, as a person clicks through it."""

    def __init__(self, driver, uri: str, experiment_id: str):
        self.driver, self.uri = driver, uri
        self.base = f"{uri}/#/experiments/{experiment_id}"

    def open(self, route: str = "", **params: str) -> None:
        """Load `route` afresh (a new hash alone does not always re-render the page), in the
        model-training view rather than the GenAI overview."""
        query = urlencode({"workflowType": "machine_learning", **params}, quote_via=quote)
        if self.driver.current_url.startswith(self.uri):  # forget the runs table's expanded rows
            self.driver.execute_script(FORGET_TABLE_STATE)
        self.driver.get("about:blank")
        self.driver.get(f"{self.base}{route}?{query}")

    def home(self, forget: bool = False) -> None:
        """The MLflow home page; `forget`: as on a first visit (the workflow switch unset)."""
        self.driver.get("about:blank")
        self.driver.get(f"{self.uri}/#/")
        if forget:
            self.driver.execute_script("localStorage.clear();")
            self.driver.get("about:blank")
            self.driver.get(f"{self.uri}/#/")
        wait_for_text(self.driver, "Recent Experiments")

    def experiment_link(self, name: str):
        """The link to experiment `name` on the home page."""

        def shown():
            found = self.driver.find_elements(By.XPATH, f"//a[normalize-space(text())='{name}']")
            return next((a for a in found if a.is_displayed()), None)

        return wait_for(shown, 30, f"a link to experiment {name!r}")

    def workflow_switch(self, label: str) -> None:
        """Flip the sidebar's GenAI / Model training switch (a script click: MLflow's first-visit
        tips may lie over it)."""
        xpath = f"//*[@role='button'][normalize-space(.)='{label}']"
        remembered = (  # MLflow keeps it under a versioned key that names it
            "return Object.keys(localStorage).filter(k => k.includes('workflowType'))"
            ".map(k => localStorage.getItem(k)).join(' ');"
        )
        wanted = {"Model training": "machine_learning", "GenAI": "genai"}[label]

        def flipped() -> bool:  # a click before the page is interactive is lost: click again
            switch = self.driver.find_element(By.XPATH, xpath)
            self.driver.execute_script("arguments[0].click();", switch)
            time.sleep(0.5)
            return wanted in self.driver.execute_script(remembered)

        wait_for(flipped, 30, f"the {label} switch remembered")

    def runs(self, search: str, parent: str, *children: str) -> str:
        """The runs table filtered by `search`, with the row of the run named `parent` expanded
        until `children` show; the page's text."""
        self.open("/runs", searchFilter=search)
        wait_for_text(self.driver, parent, "matching runs")
        self.close_assistant()
        expander = wait_for(self.expander, 30, "the parent run's expander")
        try:  # the UI remembers a row expanded earlier: a click would fold it
            wait_for_text(self.driver, *children, timeout=3)
        except TimeoutError:
            expander.click()
        self.widen_run_names()
        return wait_for_text(self.driver, *children)

    def expander(self):
        """The expand button of the (only) parent row in the runs table."""
        buttons = self.driver.find_elements(
            By.CSS_SELECTOR, "button[data-component-id*='runnamecellrenderer']"
        )
        return buttons[0] if len(buttons) == 1 else None

    def widen_run_names(self) -> None:
        """Drag the run-name column wider, so the screenshots show whole names (cosmetic)."""
        for handle in self.driver.find_elements(By.CSS_SELECTOR, ".ag-header-cell-resize"):
            column = handle.find_element(By.XPATH, "..").get_attribute("col-id") or ""
            if "Run Name" in column:
                ActionChains(self.driver).drag_and_drop_by_offset(handle, 250, 0).perform()
                return

    def close_assistant(self) -> None:
        """Close the MLflow Assistant side panel, if shown, to give the pages the full width."""
        for button in self.driver.find_elements(By.CSS_SELECTOR, "button[aria-label='Close']"):
            if button.is_displayed():
                button.click()

    def tree_entry(self, name: str):
        """The file `name` in a run's artifact tree."""
        entries = self.driver.find_elements(By.XPATH, f"//*[normalize-space(text())='{name}']")
        return next((e for e in entries if e.is_displayed()), None)

    def html_frame(self):
        """The frame the artifact viewer shows an HTML file in."""
        frames = self.driver.find_elements(By.CSS_SELECTOR, "iframe.mlflow-html-iframe")
        return frames[0] if frames else None
