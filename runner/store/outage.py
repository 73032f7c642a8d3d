"""A tracking server that stops answering in the middle of a command: restarting, or gone.

A server that has never answered this process is refused at once (BadInput: start it, or point
at one that runs). One that answered before and stops is taken for a restart (a team's store
restarts under its users: slurm/local/store_down.sh, store_up.sh): the command says so once and
waits for it, up to OUTAGE_S, then goes on where it stopped. A job's own metrics never wait:
they go to its spool (runner/store/spool.py).

`Patient` is MLflow's client with that wait around each call. A call the server had taken when
it went away is sent again, so the writes hyprun sends through it are ones a second copy cannot
double: tags, params (write-once: `Store.once`), status, a run created before the outage.
"""

from __future__ import annotations

import functools
import socket
import sys
import time
import urllib.parse
from typing import Any

from hyprun.runner.errors import BadInput
from hyprun.runner.store.direct import server_base

OUTAGE_S = 600.0
"""How long a command waits for a server that answered it before (tracking.outage_grace_s's
default: a job waits as long for its spool)."""
RETRY_S = 3.0

_answered: set[str] = set()
_down_since: dict[str, float] = {}


def answered(uri: str) -> None:
    """The server answered: a later silence is a restart, and any outage is over."""
    base = server_base(uri)
    _answered.add(base)
    _down_since.pop(base, None)


def await_server(uri: str, reason: Any) -> None:
    """Return once the server accepts connections again (the caller then retries), or
    BadInput: a server this process never reached, or one silent for OUTAGE_S."""
    base = server_base(uri)
    if base not in _answered:
        raise BadInput(
            f"the tracking server {base} does not answer ({reason}): start it, "
            "or set MLFLOW_TRACKING_URI / tracking.uri to one that runs"
        )
    if base not in _down_since:
        _down_since[base] = time.monotonic()
        print(
            f"hyprun: the tracking server {base} stopped answering ({reason}); "
            f"waiting up to {OUTAGE_S:.0f} s for it to come back",
            file=sys.stderr,
            flush=True,
        )
    while time.monotonic() - _down_since[base] < OUTAGE_S:
        time.sleep(RETRY_S)
        if _accepts(base):
            return
    raise BadInput(
        f"the tracking server {base} has not answered for {OUTAGE_S:.0f} s ({reason}): "
        "start it, then run the command again"
    )


def _accepts(base: str) -> bool:
    parts = urllib.parse.urlsplit(base)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=RETRY_S):
            return True
    except OSError:
        return False


class Patient:
    """MLflow's client, each call waiting through a restart of a server that answered before."""

    def __init__(self, client: Any, uri: str):
        self._client, self._uri = client, uri

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        @functools.wraps(attribute)
        def call(*args: Any, **kwargs: Any) -> Any:
            from mlflow.exceptions import MlflowException

            from hyprun.runner.store.tracking import unreachable

            while True:
                try:
                    result = attribute(*args, **kwargs)
                except MlflowException as error:
                    if not unreachable(error):
                        raise
                    await_server(self._uri, " ".join(str(error).split())[:160])
                    continue
                answered(self._uri)
                return result

        return call
