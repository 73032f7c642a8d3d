"""Investigations in MLflow: one parent run each, its children the baseline seeds and the tests.

Nothing here keeps a counter. The state (strikes, escalation, confirmed fix) is derived from the
children's tags every time it is read, so jobs finishing concurrently cannot corrupt it: the
worst a race can do is make two readers see the same children. Where one process must win (a
test's number, the escalation notice), `Store.once` uses the one compare-and-set MLflow has: a
run's param can be written once, and the store refuses a second, different value.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from hyprun.runner.errors import BadInput
from hyprun.runner.store import access, direct
from hyprun.runner.store.app_runs import last_per_step
from hyprun.runner.store.tracking import experiment_id, patient, redact

STRIKES = 3
ROLE, INVESTIGATION = "hyprun.role", "hyprun.investigation"
USER = "hyprun.user"
"""Who ran it: the account a team's server authenticated (runner/store/access.py)."""
NUMBER = "test.H"
"""Parent-run params `test.H1`, `test.H2`, ...: the run id holding each test number."""


def baseline_seed_key(config_hash: str, seed: int) -> str:
    """Parent-run param holding the run id of a baseline seed added after `hyprun baseline`
    (by a test that needed more seeds). Keyed by the baseline's config hash, so a promoted
    baseline never inherits the old one's seeds."""
    return f"baseline.{config_hash}.seed.{seed}"


def baseline_claim_key(config_hash: str, seed: int, attempt: int) -> str:
    """Parent-run param naming who records that seed: the first writer wins (`Store.once`);
    attempt n+1 is taken only when attempt n's controller died without recording it."""
    return f"baseline.{config_hash}.claim.{seed}.{attempt}"


@dataclass
class Test:
    """One hypothesis test: a child run of the investigation, its seed jobs below it."""

    run_id: str
    number: int
    """H1, H2, ... in order of launch; 0 while the test is taking its number."""
    delta: list[str]
    variable: str
    card: str | None
    verdict: str
    """running | confirmed | rejected | inconclusive | error | refused"""
    started: int
    tags: dict[str, str]

    @property
    def user(self) -> str:
        """Who ran the test ("" for tests recorded before runs named their user)."""
        return self.tags.get(USER, "")

    @property
    def strike(self) -> bool:
        return self.verdict == "rejected"

    @property
    def fix(self) -> list[str]:
        """The overrides a confirmed test recommends: its delta, or a sweep's best value."""
        return json.loads(self.tags.get("hyprun.best_delta", "null")) or self.delta

    @property
    def compound(self) -> list[str]:
        """For a switch a card declared compound: the shared keys it changes too."""
        return [k for k in self.tags.get("hyprun.compound", "").split(",") if k]

    @property
    def evidence_run(self) -> str:
        """The run whose seed jobs hold the evidence: the test's own, or a sweep's best trial."""
        return self.tags.get("hyprun.best_run", self.run_id)

    @property
    def seeds_shown(self) -> str:
        """Seeds per side as status and the report show them: `3`, or `1 of 3` when an early
        rejection stopped the test before its other seeds started; "" while undecided."""
        planned, ran = self.tags.get("hyprun.seeds", ""), self.tags.get("hyprun.seeds_run")
        return f"{ran} of {planned}" if ran and planned and ran != planned else planned


@dataclass
class State:
    """An investigation as its MLflow runs describe it now."""

    name: str
    run_id: str
    baseline: dict[str, Any] | None
    """{overrides, seeds, config_hash, git_sha, seed_runs}, or None before `hyprun baseline`."""
    tests: list[Test] = field(default_factory=list)
    resets: list[dict[str, Any]] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)
    """The parent run's params: test numbers, claims, added baseline seeds."""
    findings: list[dict[str, Any]] = field(default_factory=list)
    """Triage's top findings on the baseline, most likely first: {id, cause, first_action,
    cards, variables} (the cards that test each, and the config keys those cards change)."""

    @property
    def unit(self) -> str:
        """What the primary metric's step counts, so every number at a step is named by it:
        `tokens` for our job, an app's declared `metric.step` (`steps` for most trainers)."""
        app = (self.baseline or {}).get("app") or {}
        return ((app.get("declaration") or {}).get("metric") or {}).get("step") or "tokens"

    def baseline_run(self, seed: int) -> str | None:
        """The run of baseline seed `seed`: recorded with the baseline, or added later by a
        test (None: not recorded yet)."""
        recorded = self.baseline["seed_runs"]
        if seed < len(recorded):
            return recorded[seed]
        return self.params.get(baseline_seed_key(self.baseline["config_hash"], seed))

    @property
    def baseline_seeds(self) -> int:
        """How many baseline seeds are recorded, counting from seed 0 without a gap."""
        seed = 0
        while self.baseline_run(seed) is not None:
            seed += 1
        return seed

    @property
    def since_reset(self) -> list[Test]:
        """Tests claimed since the last human reset."""
        since = self.resets[-1]["time"] if self.resets else 0
        return [t for t in self.tests if t.started >= since]

    @property
    def counted(self) -> list[Test]:
        """The current run of failed fixes: tests since the last human reset numbered after
        the last confirmed one (a fix that worked ends a run; runner/control/controller.py)."""
        tests = self.since_reset
        last = max((t.number for t in tests if t.verdict == "confirmed"), default=0)
        return [t for t in tests if t.number > last or t.number == 0]

    @property
    def strikes(self) -> int:
        return sum(t.strike for t in self.counted)

    @property
    def escalated(self) -> bool:
        return self.strikes >= STRIKES

    @property
    def confirmed(self) -> list[Test]:
        return [t for t in self.tests if t.verdict == "confirmed"]

    @property
    def untested(self) -> list[dict[str, Any]]:
        """The top findings no test has touched: none of their cards ran, and no test changed a
        variable their cards change (a finding without cards is for a human to check)."""
        ran = [t for t in self.tests if t.verdict != "refused"]
        cards = {t.card for t in ran if t.card}
        variables = {t.variable for t in ran if t.variable}
        return [
            f
            for f in self.findings
            if not (cards & set(f.get("cards", [])) or variables & set(f.get("variables", [])))
        ]

    def tested(self, delta: list[str]) -> Test | None:
        """The earlier test of exactly this delta, if any (refused claims do not count)."""
        return next((t for t in self.tests if t.delta == delta and t.verdict != "refused"), None)


def findings_lines(state: State) -> list[str]:
    """Triage's top findings, and (once tests ran) the ones no test has touched yet."""
    if not state.findings:
        return ["triage: no pattern fired on the baseline"]
    lines = [
        f"triage finding {rank}: {f['id']} — {f['cause']}"
        + (f" (cards: {', '.join(f['cards'])})" if f["cards"] else " (no card tests it)")
        for rank, f in enumerate(state.findings, 1)
    ]
    if state.tests:
        for f in state.untested:
            lines.append(f"not tested yet: {f['id']} — first action: {f['first_action']}")
    return lines


class Store:
    """Reads and writes investigations in an MLflow store.

    New investigations go into `experiment`. Existing ones are found there first, then in the
    store's other experiments (the demo writes to `hyprun-demo`, a user's config may say
    `hyprun`), unless `pinned` (the user named the experiment). Once an investigation is found,
    the store follows it into its experiment, so its tests' runs land beside it."""

    def __init__(self, uri: str, experiment: str, pinned: bool = False):
        # Credentials in the URI move to MLflow's variables: no link or param shows them.
        self.uri, self.experiment, self.pinned = direct.sign_in(uri), experiment, pinned
        self._client = None
        self._may_write = False
        # Reading an investigation (`hyprun status`, every refusal) needs neither MLflow's
        # import nor its store set-up, 2-6 s together: see runner/store/direct.py.
        self.reads = direct.reader(uri, lambda: self.client)

    @property
    def client(self):
        """MLflow's client, made on first use: only writes and artifacts need it."""
        if self._client is None:
            # A server that answered and goes quiet is restarting: its calls wait for it.
            self._client = patient(self.uri)
        return self._client

    def writable(self) -> None:
        """BadInput, before the first write, when the user may only read the experiment the
        store writes into (a team's server with accounts: runner/store/access.py)."""
        if not self._may_write:
            experiment = self.reads.experiment_id(self.experiment)
            access.require_edit(self.uri, experiment, self.experiment)
            self._may_write = True

    def create(self, name: str, description: str) -> str:
        if self._parent(name) is not None:
            raise BadInput(f"investigation {name!r} exists already: pick another --investigation")
        self.writable()
        run = self.client.create_run(
            experiment_id(self.client, self.experiment),
            run_name=name,
            tags={
                ROLE: "investigation",
                INVESTIGATION: name,
                USER: access.user(self.uri),
                "mlflow.note.content": description,
            },
        )
        return run.info.run_id

    def find(self, name: str | None) -> State:
        """The named investigation, else the newest one (the last started), open or escalated.

        One rule for every command (`test`, `sweep`, `status`, `report`, `verify`, `reset`):
        the newest investigation is the one the user just worked on. Skipping an escalated one
        would lose it the moment it escalates (`status` showing an older one, `test` saying
        there is none); instead the commands an escalation forbids say so, and how to go on
        (`runner/control/controller.py` `open_test`, exit 3)."""
        if name is not None:
            parent = self._parent(name)
            if parent is None:
                raise BadInput(f"no investigation {name!r}{self._elsewhere()}")
            return self._follow(parent)
        parents = self._parents()
        if not parents:
            raise BadInput(f"no investigation yet{self._elsewhere()}")
        return self._follow(parents[0])

    def _follow(self, parent) -> State:
        """The investigation's state; the store now writes into the investigation's experiment."""
        self.experiment = self.reads.experiment_name(parent.info.experiment_id)
        return self.state(parent)

    def _elsewhere(self) -> str:
        """The end of a not-found message: where investigations are, or how to start one."""
        searched = f"experiment {self.experiment!r}" if self.pinned else "this MLflow store"
        found = {}
        if self.pinned:
            for run in self._search(self._experiment_ids(others=True)):
                found.setdefault(run.info.experiment_id, []).append(run)
        if not found:
            return f" in {searched} ({self.uri}): start one with 'hyprun baseline'"
        names = ", ".join(
            f"{self.reads.experiment_name(e)!r} ({len(runs)})" for e, runs in found.items()
        )
        return f" in {searched}; investigations are in experiment {names}: pass --experiment NAME"

    def state(self, parent) -> State:
        tags = parent.data.tags
        children = self._children(parent.info.run_id)
        numbers = {
            run: int(key[len(NUMBER) :])
            for key, run in parent.data.params.items()
            if key.startswith(NUMBER)
        }
        tests = sorted(
            (_test(run, numbers) for run in children if run.data.tags.get(ROLE) == "test"),
            key=lambda t: (t.number or math.inf, t.started, t.run_id),
        )
        baseline = json.loads(tags["hyprun.baseline"]) if "hyprun.baseline" in tags else None
        resets = sorted(
            (json.loads(v) for k, v in tags.items() if k.startswith("hyprun.reset.")),
            key=lambda r: r["time"],
        )
        params = dict(parent.data.params)
        findings = json.loads(tags.get("hyprun.findings", "[]"))
        return State(
            tags[INVESTIGATION], parent.info.run_id, baseline, tests, resets, params, findings
        )

    def refresh(self, state: State) -> State:
        return self.state(self.reads.get_run(state.run_id))

    def once(self, run_id: str, key: str, value: str) -> bool:
        """Write param `key` unless another process wrote it first: True when this call won."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.log_param(run_id, key, value)
            return True
        except MlflowException:
            held = self.client.get_run(run_id).data.params.get(key)
            if held is None:
                raise  # not a lost race: a real error
            return held == value

    def number(self, state: State, run_id: str) -> int:
        """The test's number, H1, H2, ...: the lowest free one, taken once, so concurrent
        tests get distinct numbers and agree on their order whatever their clocks say."""
        number = max((t.number for t in state.tests), default=0) + 1
        while not self.once(state.run_id, f"{NUMBER}{number}", run_id):
            number += 1
        return number

    def child(self, parent_id: str, name: str, tags: dict[str, str]) -> str:
        self.writable()
        run = self.client.create_run(
            self.client.get_run(parent_id).info.experiment_id,
            run_name=name,
            tags={**tags, USER: access.user(self.uri), "mlflow.parentRunId": parent_id},
        )
        return run.info.run_id

    def tag(self, run_id: str, tags: dict[str, Any]) -> None:
        self.writable()
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, redact(str(v))) for k, v in tags.items()])

    def note(self, run_id: str, text: str) -> None:
        self.tag(run_id, {"mlflow.note.content": text})

    def rename(self, run_id: str, name: str) -> None:
        self.client.update_run(run_id, name=name)

    def text(self, run_id: str, text: str, path: str) -> None:
        self.client.log_text(run_id, redact(text), path)

    def metrics(self, run_id: str, values: dict[str, float], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(
            run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items()]
        )

    def params(self, run_id: str, values: dict[str, str]) -> None:
        from mlflow.entities import Param

        self.client.log_batch(
            run_id, params=[Param(k, redact(v)[:6000]) for k, v in values.items()]
        )

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def reopen(self, run_id: str) -> None:
        """Mark a finished run running again (an investigation whose test has started)."""
        self.client.update_run(run_id, status="RUNNING")

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """One value per step (the last logged: a job resumed from an earlier checkpoint may log
        a step again)."""
        return last_per_step(self.client.get_metric_history(run_id, key))

    def run(self, run_id: str):
        """One run as MLflow returns it (`.info`, `.data.tags`, `.data.metrics`, `.data.params`)."""
        return self.client.get_run(run_id)

    def attach(self, run_id: str, path: Path, folder: str) -> None:
        """Log a local file as an artifact of the run, under `folder`."""
        self.client.log_artifact(run_id, str(path), folder)

    def json_artifact(self, run_id: str, path: str) -> dict[str, Any] | None:
        """A JSON artifact of a run, or None when it was never logged (older runs)."""
        from mlflow.exceptions import MlflowException

        with tempfile.TemporaryDirectory() as folder:
            try:
                local = self.client.download_artifacts(run_id, path, folder)
            except MlflowException:
                return None
            return json.loads(Path(local).read_text())

    def jobs_below(self, run_id: str) -> list:
        """The seed jobs anywhere below a run: a test's own, or its sweep trials'."""
        found, level = [], [run_id]
        while level:
            children = [run for parent in level for run in self._children(parent)]
            found += [r for r in children if "hyprun.seed" in r.data.tags]
            level = [r.info.run_id for r in children if "hyprun.seed" not in r.data.tags]
        return found

    def seed_runs(self, parent_id: str) -> list:
        """The job runs directly below `parent_id` (baseline seeds or one test's seeds)."""
        return [r for r in self._children(parent_id) if "hyprun.seed" in r.data.tags]

    def _parents(self) -> list:
        """Investigation runs, newest first: this experiment's, then (unless pinned) the rest."""
        found = self._search(self._experiment_ids(others=False))
        if not self.pinned:
            found += self._search(self._experiment_ids(others=True))
        return found

    def _experiment_ids(self, others: bool) -> list[str]:
        """This experiment's id (when it exists), or the ids of every other experiment."""
        if not others:
            mine = self.reads.experiment_id(self.experiment)
            return [mine] if mine else []
        return self.reads.other_experiment_ids(self.experiment)

    def _search(self, experiment_ids: list[str]) -> list:
        if not experiment_ids:
            return []
        return self.reads.search(experiment_ids, {ROLE: "investigation"}, 5000)

    def _parent(self, name: str):
        return next((r for r in self._parents() if r.data.tags.get(INVESTIGATION) == name), None)

    def _children(self, parent_id: str) -> list:
        experiment = self.reads.get_run(parent_id).info.experiment_id
        return self.reads.search([experiment], {"mlflow.parentRunId": parent_id}, 5000)


UI_LOCAL = "http://127.0.0.1:5000"
"""Where `mlflow ui` serves a local store (its default port)."""
SHARED_VIEW = "mlflow.sharedViewState."
"""Experiment-tag prefix of the MLflow UI's saved views (3.x): `?viewStateShareKey=KEY` opens
the one stored under `mlflow.sharedViewState.KEY`."""
ARM = "hyprun.arm"
"""Seed-run tag: which side of the comparison a seed is on (`baseline`, or the test's name with
its verdict): group the runs table or its charts by it to see each side's seed band."""


@dataclass
class Links:
    """Where to look at an investigation: the command that serves the UI and two deep links."""

    serve: str
    """`mlflow ui --backend-store-uri ...`, or "" when the store is a tracking server."""
    runs: str
    """Its runs grouped by role: each test's name with its verdict and effect, one list."""
    compare: str
    """Its seed runs grouped by side (baseline, each test), loss curves in the chart view."""
    escalation: str
    """Its escalation report (escalation.md on its run), or "" while it is not escalated."""
    home: str = UI_LOCAL
    """The UI's address: the tracking server's (without credentials), or `mlflow ui`'s."""


def links(store: Store, state: State) -> Links:
    """Deep links into the MLflow UI, to the saved views `save_views` wrote. MLflow 3.17 opens
    an experiment on its GenAI overview unless the page's `workflowType` is machine_learning
    (the sidebar switch, remembered per browser; the `mlflow.experimentKind` tag no longer
    decides): every link carries it."""
    served = store.uri.startswith(("http://", "https://"))
    base = direct.server_base(store.uri) if served else UI_LOCAL  # no credentials in a link
    serve = "" if served else f"mlflow ui --backend-store-uri {store.uri}"
    experiment = store.reads.get_run(state.run_id).info.experiment_id
    page = f"{base}/#/experiments/{experiment}/runs"
    model_training = {"workflowType": "machine_learning"}

    def link(view: str, mode: str) -> str:
        query = {**model_training, "viewStateShareKey": view, "compareRunsMode": mode}
        return f"{page}?{urlencode(query, quote_via=quote)}"

    runs_view, compare_view = view_keys(state.name)
    escalation = ""
    if state.escalated:
        escalation = f"{page}/{state.run_id}/artifacts/escalation.md?{urlencode(model_training)}"
    return Links(serve, link(runs_view, "TABLE"), link(compare_view, "CHART"), escalation, base)


def view_keys(name: str) -> tuple[str, str]:
    """The keys of an investigation's two saved views: its runs, and its comparison."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)
    if slug != name or len(slug) > 64:  # MLflow caps a tag key at 250 characters; a digest
        # also keeps apart two names that read the same once sanitised ("a b", "a-b").
        slug = f"{slug[:64]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return f"hyprun-{slug}-runs", f"hyprun-{slug}-compare"


CURVES = ("eval/loss", "train/loss", "grad/norm")
"""The comparison view's charts: each side's seed mean and range at matched tokens."""
MARGIN = 0.1
"""Room above and below the curves in a chart, as a share of their span."""
RUN_NAME_COLUMN = "attributes.`Run Name`"
COLUMNS = ["0", RUN_NAME_COLUMN, "runDateAndNestInfo", "duration"]
"""The runs table's first columns: MLflow applies saved widths along a saved column order."""


def save_views(store: Store, state: State) -> None:
    """Two saved views of the investigation on its experiment (MLflow lists them under
    "Views"; `links` opens them): its runs grouped by role, the run names wide enough to read
    the verdicts; and its seed runs grouped by `hyprun.arm` (the baseline, each test), the loss
    curves as each group's mean and range."""
    mine = f"tags.`{INVESTIGATION}` = '{state.name}'"
    wide = {"columnOrder": COLUMNS, "columnWidths": {RUN_NAME_COLUMN: 560}}
    runs = {
        "searchFilter": mine,
        "orderByKey": "attributes.start_time",
        "orderByAsc": True,
        "groupBy": _group_by(ROLE),
        **wide,
    }
    section = "hyprun-curves"
    ranges = curve_ranges(store, state)
    compare = {
        "searchFilter": f"{mine} and tags.`{ARM}` LIKE '%'",
        "orderByKey": "attributes.start_time",
        "orderByAsc": True,
        "groupBy": _group_by(ARM),
        "useGroupedValuesInCharts": True,
        "runsHiddenMode": "SHOW_ALL",  # MLflow's default draws only the first 10 rows
        "hideEmptyCharts": True,
        "isAccordionReordered": True,  # keeps our section first, before the generated ones
        "compareRunSections": [
            {
                "uuid": section,
                "name": "hyprun: baseline vs tests (seed mean and range)",
                "display": True,
                "isReordered": False,
                "deleted": False,
                "isGenerated": False,
                # One chart a row, taller than MLflow's 360 px: room for a legend entry per side
                "columns": 1,
                "cardHeight": 520,
            }
        ],
        "compareRunCharts": [
            {
                "uuid": f"hyprun-{metric_id}",
                "type": "LINE",
                "runsCountToCompare": 100,
                "metricSectionId": section,
                "deleted": False,
                "isGenerated": False,
                "metricKey": metric,
                "selectedMetricKeys": [metric],
                "xAxisKey": "step",  # titled "Step" by MLflow: our jobs log at tokens trained
                "useGlobalXaxisKey": False,  # else the page's x-axis setting overrides ours
                "yAxisKey": "metric",
                "scaleType": "linear",
                "range": ranges.get(metric, {}),
                "displayPoints": True,
                "lineSmoothness": 0,
                "useGlobalLineSmoothing": False,
            }
            for metric in CURVES
            if (metric_id := re.sub(r"[^a-z]+", "-", metric))
        ],
        **wide,
    }
    runs_key, compare_key = view_keys(state.name)
    experiment = store.client.get_run(state.run_id).info.experiment_id
    for key, title, view in (
        (runs_key, "runs by role", runs),
        (compare_key, "baseline vs tests", compare),
    ):
        store.client.set_experiment_tag(
            experiment, SHARED_VIEW + key, _envelope(f"hyprun {state.name}: {title}", view)
        )


def curve_ranges(store: Store, state: State) -> dict[str, dict[str, float]]:
    """{chart: its y range}: the seed curves' lowest and highest values, with a margin. MLflow
    fills each side's seed band down to 0, so left to itself every loss chart starts at 0 and
    curves between 4.4 and 5.5 share a thin strip at its top."""
    seeds = state.baseline_seeds if state.baseline else 0
    runs = [state.baseline_run(seed) for seed in range(seeds)]
    runs += [job.info.run_id for test in state.tests for job in store.jobs_below(test.run_id)]
    ranges = {}
    for metric in CURVES:
        values = [v for run in runs for _, v in store.history(run, metric) if math.isfinite(v)]
        if values:
            low, high = min(values), max(values)
            margin = MARGIN * ((high - low) or abs(high) or 1.0)
            ranges[metric] = {"yMin": low - margin, "yMax": high + margin}
    return ranges


def _group_by(tag: str) -> dict[str, Any]:
    return {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": tag}]}


def _envelope(name: str, view: dict[str, Any]) -> str:
    """A saved view as the MLflow UI stores it: {name, createdAt, updatedAt, state: JSON}."""
    now = int(time.time() * 1000)
    return json.dumps({"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(view)})


def _test(run, numbers: dict[str, int]) -> Test:
    tags = run.data.tags
    return Test(
        run_id=run.info.run_id,
        # Tests claimed before numbers were params carry only the tag.
        number=numbers.get(run.info.run_id) or int(tags.get("hyprun.number", "0")),
        delta=json.loads(tags.get("hyprun.delta", "[]")),
        variable=tags.get("hyprun.variable", ""),
        card=tags.get("hyprun.card") or None,
        verdict=tags.get("hyprun.verdict", "running"),
        started=int(tags.get("hyprun.claimed_ms", run.info.start_time)),
        tags=tags,
    )
