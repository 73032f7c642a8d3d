"""Escalation notices: a webhook POST and/or a local command. Best effort by design: a failing
notifier is reported, never raised, so it can neither block nor lose the escalation report."""

from __future__ import annotations

import json
import shlex
import subprocess
import urllib.request
from typing import Any

from hyprun.runner.store.tracking import redact

TIMEOUT_S = 10


def notify(summary: dict[str, Any], url: str | None, command: str | None) -> list[str]:
    """Send `summary`; returns one line per channel: 'url: ok' or 'command: failed (...)'."""
    outcomes = []
    body = redact(json.dumps(summary)).encode()
    if url:
        try:
            request = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/json"}, method="POST"
            )
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                outcomes.append(f"url: ok ({response.status})")
        except Exception as error:
            outcomes.append(f"url: failed ({error})")
    if command:
        try:
            subprocess.run(
                shlex.split(command), input=body, timeout=TIMEOUT_S, check=True, capture_output=True
            )
            outcomes.append("command: ok")
        except Exception as error:
            outcomes.append(f"command: failed ({error})")
    return outcomes
