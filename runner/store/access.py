"""Who writes to the store, and whether they may: a team's tracking server with MLflow's own
authentication (`mlflow server --app-name basic-auth`, slurm/local/store_up.sh).

Each run hyprun creates carries `hyprun.user`: the account the server authenticated, or, on a
store without accounts (a sqlite file, a server without auth), the login name MLflow itself
records as `mlflow.user`. A user who may only read an experiment is refused in one line before
anything is written, instead of MLflow's 403 in the middle of a test.

The two questions go to the auth app's REST routes (`/users/current`, `/users/permissions/get`)
with the credentials MLflow's client would send (runner/store/direct.py): importing
`mlflow.server.auth.client` would import the whole server (~3 s) before a refusal.
"""

from __future__ import annotations

import getpass
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from hyprun.runner.errors import BadInput
from hyprun.runner.store.direct import _auth_headers, _tls_context, server_base
from hyprun.runner.store.tracking import redact

TIMEOUT_S = 15.0
WRITES = ("EDIT", "MANAGE")
"""The permissions that update runs (mlflow.server.auth.permissions: `can_update`)."""


@dataclass(frozen=True)
class Account:
    """The account a tracking server with basic-auth authenticated."""

    username: str
    is_admin: bool


def account(uri: str) -> Account | None:
    """The signed-in account, or None when `uri` has no accounts (a file, a server without
    auth). Refused in one line when the server turns the credentials away."""
    if urllib.parse.urlsplit(uri).scheme not in ("http", "https"):
        return None
    found = _get(uri, "/api/2.0/mlflow/users/current")
    if found is None:
        return None
    user = found["user"]
    return Account(user["username"], bool(user.get("is_admin")))


def user(uri: str) -> str:
    """Who runs this command, as `hyprun.user` records it. While the server does not answer,
    the account MLflow's client signs in as (asked again next time)."""
    if uri not in _USERS:
        try:
            signed_in = account(uri)
        except Unanswered:
            return os.environ.get("MLFLOW_TRACKING_USERNAME") or login()
        _USERS[uri] = signed_in.username if signed_in else login()
    return _USERS[uri]


def login() -> str:
    """This process's login name, as MLflow records `mlflow.user` (a container's uid may have
    no name: then "unknown")."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


_USERS: dict[str, str] = {}
"""Each store's answer, once per process: a command's runs are all its one user's."""


def require_edit(uri: str, experiment_id: str | None, experiment: str) -> None:
    """BadInput unless the signed-in account may write runs into the experiment. A missing
    experiment is created by whoever writes first (its creator gets MANAGE), so it passes; so
    does a server that cannot say (no auth, down: the write that follows meets it as it is)."""
    try:
        signed_in = account(uri)
        if signed_in is None or signed_in.is_admin or experiment_id is None:
            return
        route = "/api/3.0/mlflow/users/permissions/get"
        found = _get(
            uri,
            route,
            username=signed_in.username,
            resource_type="experiment",
            resource_id=experiment_id,
        )
    except Unanswered:
        return
    permission = (found or {}).get("permission")
    if permission is not None and permission not in WRITES:
        raise BadInput(
            f"{signed_in.username!r} may not write to experiment {experiment!r} on "
            f"{redact(uri)} (permission {permission}): ask its owner or the store's admin "
            "for EDIT on it, or record a baseline of your own with --experiment NAME"
        )


def not_signed_in(uri: str) -> BadInput:
    """The refusal for a server that turned the credentials away (HTTP 401)."""
    return BadInput(
        f"the tracking server {redact(uri)} did not accept the credentials: set "
        "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to your account's"
    )


class Unanswered(Exception):
    """The server did not answer (down, restarting)."""


def _get(uri: str, route: str, **query: str) -> dict | None:
    """The JSON a GET of `route` answers; None when the server does not serve it (no auth, a
    proxy's page): only the auth app answers these routes."""
    parts = urllib.parse.urlsplit(uri)
    address = f"{server_base(uri)}{route}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    request = urllib.request.Request(address, headers=_auth_headers(parts))
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=_tls_context()) as answer:
            return json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        if error.code == 401:
            raise not_signed_in(uri) from None
        if error.code in (502, 503, 504):  # a proxy in front of a restarting server
            raise Unanswered from None
        return None
    except (urllib.error.URLError, TimeoutError, ConnectionError):
        raise Unanswered from None
    except ValueError:  # not JSON: not the auth app
        return None
