"""Reading an investigation's runs without importing MLflow: a user waiting on `hyprun status`.

Importing MLflow takes 1-3 s and opening its sqlite store another 1-3 s (engine, migration
check) on a 2-core login node, before a single row is read. An investigation needs four reads:
an experiment by name, runs by tag, one run, and each run's tags, params and latest metrics.
They are read here straight from the two stores hyprun uses:

- `sqlite:///PATH`: the file MLflow writes, opened read-only (nothing is created or migrated);
- `http(s)://HOST`: the tracking server's REST API (`/api/2.0/mlflow/...`), the one MLflow's
  own client calls.

Both return `Run`s shaped like MLflow's (`run.info.run_id`, `run.data.tags`, ...), ordered the
way MLflow orders them (start time descending, then run id). Any other URI (a file store,
Databricks, an auth plugin) reads through MLflow's client, as does a server that answers in a
way this module does not expect.
"""

from __future__ import annotations

import base64
import json
import math
import os
import sqlite3
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEARCH_PAGE = 1000  # MLflow's default page of search results
SQLITE_VARIABLES = 900  # below sqlite's oldest limit on `?` placeholders per statement


@dataclass
class RunInfo:
    run_id: str
    experiment_id: str
    run_name: str | None
    status: str
    start_time: int | None
    end_time: int | None
    lifecycle_stage: str
    artifact_uri: str | None
    user_id: str | None

    @property
    def run_uuid(self) -> str:
        return self.run_id


@dataclass
class RunData:
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class Run:
    info: RunInfo
    data: RunData


def reader(uri: str, client_factory) -> SqliteReads | RestReads | ClientReads:
    """The quickest reader of `uri`; `client_factory()` makes an MlflowClient when one is needed."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme == "sqlite" and uri.startswith("sqlite:///") and not parts.query:
        return SqliteReads(Path(uri[len("sqlite:///") :]))
    if parts.scheme in ("http", "https") and not _needs_client_auth():
        return RestReads(uri, client_factory)
    return ClientReads(client_factory)


class SqliteReads:
    """MLflow's sqlite file, read-only: a missing file or table is an empty store."""

    def __init__(self, path: Path):
        self.path = path

    def experiment_id(self, name: str) -> str | None:
        with self._snapshot() as db:
            if db is None:
                return None
            rows = db.execute("SELECT * FROM experiments WHERE name = ?", (name,)).fetchall()
        # MLflow 3 keeps a workspace per experiment; hyprun's runs live in the default one.
        rows = [r for r in rows if _workspace(r) in (None, "default")]
        return str(rows[0]["experiment_id"]) if rows else None

    def experiment_name(self, experiment_id: str) -> str:
        with self._snapshot() as db:
            query = "SELECT name FROM experiments WHERE experiment_id = ?"
            row = None if db is None else db.execute(query, (int(experiment_id),)).fetchone()
        if row is None:
            raise LookupError(f"no experiment {experiment_id} in {self.path}")
        return row["name"]

    def other_experiment_ids(self, name: str) -> list[str]:
        """The active experiments not called `name` (MLflow's search_experiments' default)."""
        with self._snapshot() as db:
            if db is None:
                return []
            query = "SELECT * FROM experiments WHERE lifecycle_stage = 'active' AND name != ?"
            rows = db.execute(query, (name,)).fetchall()
        return [str(r["experiment_id"]) for r in rows if _workspace(r) in (None, "default")]

    def search(
        self, experiment_ids: list[str], tags: dict[str, str], max_results: int = SEARCH_PAGE
    ) -> list[Run]:
        """Active runs of the experiments carrying every tag in `tags`, as MLflow orders them."""
        marks = ",".join("?" * len(experiment_ids))
        where = [f"r.experiment_id IN ({marks})"]
        where.append("r.lifecycle_stage = 'active'")
        values: list[Any] = [int(e) for e in experiment_ids]
        for key, value in tags.items():
            where.append(
                "EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid"
                " AND t.key = ? AND t.value = ?)"
            )
            values += [key, value]
        query = (
            f"SELECT r.* FROM runs r WHERE {' AND '.join(where)}"
            " ORDER BY r.start_time DESC, r.run_uuid LIMIT ?"
        )
        with self._snapshot() as db:
            if db is None:
                return []
            rows = db.execute(query, (*values, max_results)).fetchall()
            return self._runs(db, rows)

    def get_run(self, run_id: str) -> Run:
        with self._snapshot() as db:
            rows = [] if db is None else self._rows(db, "runs", [run_id], "*")
            if not rows:
                raise LookupError(f"no run {run_id} in {self.path}")
            return self._runs(db, rows)[0]

    @contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection | None]:
        """One read transaction (a consistent view while jobs write), or None: no store yet."""
        if not self.path.exists():
            yield None
            return
        location = "file:" + urllib.parse.quote(str(self.path.resolve())) + "?mode=ro"
        db = sqlite3.connect(location, uri=True, timeout=60, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            db.execute("BEGIN")
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
            yield db if {"experiments", "runs", "tags"} <= tables else None
        finally:
            db.close()

    def _runs(self, db: sqlite3.Connection, rows: list[sqlite3.Row]) -> list[Run]:
        ids = [row["run_uuid"] for row in rows]
        data = {run_id: RunData() for run_id in ids}
        for row in self._rows(db, "tags", ids, "run_uuid, key, value"):
            data[row["run_uuid"]].tags[row["key"]] = row["value"]
        for row in self._rows(db, "params", ids, "run_uuid, key, value"):
            data[row["run_uuid"]].params[row["key"]] = row["value"]
        for row in self._rows(db, "latest_metrics", ids, "run_uuid, key, value, is_nan"):
            value = math.nan if row["is_nan"] else float(row["value"])
            data[row["run_uuid"]].metrics[row["key"]] = value
        return [Run(_info_of_row(row), data[row["run_uuid"]]) for row in rows]

    @staticmethod
    def _rows(db: sqlite3.Connection, table: str, ids: list[str], columns: str) -> list:
        found = []
        for i in range(0, len(ids), SQLITE_VARIABLES):
            chunk = ids[i : i + SQLITE_VARIABLES]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT {columns} FROM {table} WHERE run_uuid IN ({marks})"
            found += db.execute(query, chunk).fetchall()
        return found


def _workspace(row: sqlite3.Row) -> str | None:
    return dict(row).get("workspace")


def _info_of_row(row: sqlite3.Row) -> RunInfo:
    return RunInfo(
        run_id=row["run_uuid"],
        experiment_id=str(row["experiment_id"]),
        run_name=row["name"],
        status=row["status"],
        start_time=row["start_time"],
        end_time=row["end_time"],
        lifecycle_stage=row["lifecycle_stage"],
        artifact_uri=row["artifact_uri"],
        user_id=row["user_id"],
    )


class RestReads:
    """A tracking server's REST API. A server that does not answer is BadInput (MLflow's client
    would retry for minutes), unless it answered before: a restart, waited for
    (runner/store/outage.py). One that answers unexpectedly (auth, an old version) hands the
    reads to MLflow's client."""

    def __init__(self, uri: str, client_factory):
        parts = urllib.parse.urlsplit(uri)
        self.base = server_base(uri)
        self.uri = uri
        self.headers = {"Content-Type": "application/json", **_auth_headers(parts)}
        self.timeout_s = float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", "120"))
        self.client_factory = client_factory
        self.fallback: ClientReads | None = None

    def experiment_id(self, name: str) -> str | None:
        if self.fallback:
            return self.fallback.experiment_id(name)
        query = urllib.parse.urlencode({"experiment_name": name})
        try:
            found = self._call("GET", f"experiments/get-by-name?{query}")
        except _NotFound:
            return None
        except _Unexpected:
            return self._fall_back().experiment_id(name)
        return str(found["experiment"]["experiment_id"])

    def experiment_name(self, experiment_id: str) -> str:
        if self.fallback:
            return self.fallback.experiment_name(experiment_id)
        query = urllib.parse.urlencode({"experiment_id": experiment_id})
        try:
            return self._call("GET", f"experiments/get?{query}")["experiment"]["name"]
        except _NotFound:
            raise LookupError(f"no experiment {experiment_id} on {self.base}") from None
        except _Unexpected:
            return self._fall_back().experiment_name(experiment_id)

    def other_experiment_ids(self, name: str) -> list[str]:
        if self.fallback:
            return self.fallback.other_experiment_ids(name)
        found, token = [], {}
        try:
            while True:
                body = {"max_results": SEARCH_PAGE, "view_type": "ACTIVE_ONLY", **token}
                page = self._call("POST", "experiments/search", body)
                found += [e for e in page.get("experiments", []) if e["name"] != name]
                if not page.get("next_page_token"):
                    break
                token = {"page_token": page["next_page_token"]}
        except (_NotFound, _Unexpected):
            return self._fall_back().other_experiment_ids(name)
        return [str(e["experiment_id"]) for e in found]

    def search(
        self, experiment_ids: list[str], tags: dict[str, str], max_results: int = SEARCH_PAGE
    ) -> list[Run]:
        if self.fallback:
            return self.fallback.search(experiment_ids, tags, max_results)
        body = {
            "experiment_ids": list(experiment_ids),
            "filter": " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items()),
            "run_view_type": "ACTIVE_ONLY",
            "order_by": ["attributes.start_time DESC"],
        }
        runs: list[Run] = []
        token: dict[str, str] = {}
        try:
            while len(runs) < max_results:
                page = min(max_results - len(runs), 50000)
                found = self._call("POST", "runs/search", {**body, "max_results": page} | token)
                runs += [_run_of_json(run) for run in found.get("runs", [])]
                if not found.get("next_page_token"):
                    break
                token = {"page_token": found["next_page_token"]}
        except (_NotFound, _Unexpected):
            return self._fall_back().search(experiment_ids, tags, max_results)
        return runs

    def get_run(self, run_id: str) -> Run:
        if self.fallback:
            return self.fallback.get_run(run_id)
        query = urllib.parse.urlencode({"run_id": run_id})
        try:
            return _run_of_json(self._call("GET", f"runs/get?{query}")["run"])
        except _NotFound:
            raise LookupError(f"no run {run_id} on {self.base}") from None
        except _Unexpected:
            return self._fall_back().get_run(run_id)

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            f"{self.base}/api/2.0/mlflow/{path}",
            data=json.dumps(body).encode() if body is not None else None,
            headers=self.headers,
            method=method,
        )
        from hyprun.runner.store import outage

        while True:
            try:
                found = self._send(request)
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                # never answered: BadInput; answered before: a restart, waited for
                outage.await_server(self.uri, getattr(error, "reason", error))
                continue
            outage.answered(self.uri)
            return found

    def _send(self, request: urllib.request.Request) -> dict:
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout_s, context=_tls_context()
            ) as answer:
                return json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as error:
            if error.code == 404 and _error_code(error) == "RESOURCE_DOES_NOT_EXIST":
                raise _NotFound from None
            if error.code == 401:  # MLflow's client would only say it with a traceback
                from hyprun.runner.store.access import not_signed_in

                raise not_signed_in(self.uri) from None
            raise _Unexpected from None
        except ValueError:  # not JSON: a proxy's page, not MLflow
            raise _Unexpected from None

    def _fall_back(self) -> ClientReads:
        self.fallback = ClientReads(self.client_factory)
        return self.fallback


class ClientReads:
    """The same reads through MLflow's own client (any store MLflow supports)."""

    def __init__(self, client_factory):
        self.client_factory = client_factory

    def experiment_id(self, name: str) -> str | None:
        found = self.client_factory().get_experiment_by_name(name)
        return None if found is None else found.experiment_id

    def experiment_name(self, experiment_id: str) -> str:
        return self.client_factory().get_experiment(experiment_id).name

    def other_experiment_ids(self, name: str) -> list[str]:
        experiments = self.client_factory().search_experiments()
        return [e.experiment_id for e in experiments if e.name != name]

    def search(
        self, experiment_ids: list[str], tags: dict[str, str], max_results: int = SEARCH_PAGE
    ) -> list:
        return self.client_factory().search_runs(
            experiment_ids,
            filter_string=" and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items()),
            order_by=["attributes.start_time DESC"],
            max_results=max_results,
        )

    def get_run(self, run_id: str):
        return self.client_factory().get_run(run_id)


class _NotFound(Exception):
    """The server says the experiment or run does not exist."""


class _Unexpected(Exception):
    """The server answered, but not as the REST API of an MLflow server without auth plugins."""


def _run_of_json(run: dict) -> Run:
    info = run["info"]
    data = run.get("data", {})

    def as_int(value) -> int | None:
        return None if value is None else int(value)

    return Run(
        RunInfo(
            run_id=info["run_id"],
            experiment_id=str(info["experiment_id"]),
            run_name=info.get("run_name"),
            status=info.get("status", "RUNNING"),
            start_time=as_int(info.get("start_time")),
            end_time=as_int(info.get("end_time")),
            lifecycle_stage=info.get("lifecycle_stage", "active"),
            artifact_uri=info.get("artifact_uri"),
            user_id=info.get("user_id"),
        ),
        RunData(
            metrics={m["key"]: float(m["value"]) for m in data.get("metrics", [])},
            params={p["key"]: p.get("value", "") for p in data.get("params", [])},
            tags={t["key"]: t.get("value", "") for t in data.get("tags", [])},
        ),
    )


def server_base(uri: str) -> str:
    """A server's address without the `user:password@` a URI may carry (MLflow's client sends
    those as basic-auth): what requests go to, and what links and messages show."""
    parts = urllib.parse.urlsplit(uri)
    netloc = parts.hostname or ""
    netloc += f":{parts.port}" if parts.port else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def sign_in(uri: str) -> str:
    """`uri` without the `user:password@` it may carry: those go to MLFLOW_TRACKING_USERNAME and
    MLFLOW_TRACKING_PASSWORD, which MLflow's client sends alike (and which redaction masks),
    since it prints every run's link from the URI it was given, the password in it."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or parts.password is None:
        return uri
    os.environ["MLFLOW_TRACKING_USERNAME"] = urllib.parse.unquote(parts.username or "")
    os.environ["MLFLOW_TRACKING_PASSWORD"] = urllib.parse.unquote(parts.password)
    return server_base(uri)


def _needs_client_auth() -> bool:
    """Auth this module does not speak (plugins, client certificates): MLflow's client does."""
    return bool(
        os.environ.get("MLFLOW_TRACKING_AUTH") or os.environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH")
    )


def _auth_headers(parts: urllib.parse.SplitResult) -> dict[str, str]:
    """The credentials MLflow's client would send: a token, or a user and password from the
    environment or the URI."""
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user = os.environ.get("MLFLOW_TRACKING_USERNAME") or parts.username
    password = os.environ.get("MLFLOW_TRACKING_PASSWORD") or parts.password
    if user and password:
        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {pair}"}
    return {}


def _tls_context() -> ssl.SSLContext | None:
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
        return ssl._create_unverified_context()
    cafile = os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH")
    return ssl.create_default_context(cafile=cafile) if cafile else None


def _error_code(error: urllib.error.HTTPError) -> str:
    try:
        return json.loads(error.read() or b"{}").get("error_code", "")
    except ValueError:
        return ""
