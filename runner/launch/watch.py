"""Early rejection for a user's app: read its metric as it is logged, and ask it to stop.

Our own job calls `on_eval` at each evaluation; an app does not know hyprun, so a thread reads
the seed's MLflow run every `POLL_S` seconds and hands each new (step, value) of the declared
metric to `on_eval`. When that says stop, `ask` delivers the request (runner/job/stop.py: the
flag or the signal in this process, SIGTERM to a subprocess). Once the app has ended, the points
it logged since the last read are judged too: every point is seen, as our job's are, so the
verdict does not depend on when the reads fell, only the tokens saved do.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from hyprun.runner.store import app_runs

POLL_S = 0.5
"""Seconds between reads of the seed's run: a read is one metric-history query; an app's
evaluations are seconds to minutes apart."""


class MetricWatch:
    """Feeds a running app's `metric` to `on_eval`; `ask()` once it returns True."""

    def __init__(
        self,
        uri: str,
        run_id: str,
        metric: str,
        on_eval: Callable[[int, float], bool] | None,
        ask: Callable[[], None],
    ):
        self.uri, self.run_id, self.metric = uri, run_id, metric
        self.on_eval, self.ask = on_eval, ask
        self.seen = 0
        self.fired = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="hyprun-watch", daemon=True)

    def __enter__(self) -> MetricWatch:
        if self.on_eval is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.on_eval is not None and not self.fired:
            self.read()  # the points logged after the last read

    def _poll(self) -> None:
        while not self._done.wait(POLL_S) and not self.fired:
            try:
                self.read()
            except Exception as error:  # a busy store: read again next time, the app goes on
                print(f"hyprun: watching {self.metric}: {error}; trying again", file=sys.stderr)
                continue
            if self.fired:
                self.ask()

    def read(self) -> None:
        """Judge the points logged since the last read; `fired` once one says stop."""
        points = app_runs.history(self.uri, self.run_id, self.metric)
        for step, value in points[self.seen :]:
            self.seen += 1
            if self.on_eval(step, value):
                self.fired = True
                return
