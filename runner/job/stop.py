"""hyprun's request that an app's seed stop early (early rejection), as the app sees it.

The contract, for any app hyprun runs:

- In a subprocess (`run: subprocess` in hyprun.yaml; every Slurm job, where `scancel` sends the
  same) hyprun asks by SIGTERM; in hyprun's own process, by a flag. `requested()` is True from
  then on.
- A `Probe` (and so `HyprunTrainerCallback` and `HyprunLightningCallback`) *honours* the request:
  the loop ends at the next optimizer-step boundary. The callbacks stop their trainer
  (`control.should_training_stop`, `trainer.should_stop`); a plain loop reads
  `probe.should_stop` after each step (`if probe.should_stop: break`), and one that steps on
  anyway gets `StopRequested` from the probe's next `after_step`.
- An app in a subprocess with no probe gets `StopRequested` at once, where the signal finds it.
  In hyprun's own process such an app runs its seed to the end (its other seeds are not
  started): an exception thrown into arbitrary app code there could leave hyprun's own MLflow
  store mid-write (a run here once left the sqlite store locked), where a subprocess that exits
  releases everything.

`StopRequested` is a `SystemExit` with the conventional 75 ("interrupted"): it unwinds the app
(`with mlflow.start_run()` closes its run, `finally` blocks run) and ends its process without a
traceback. hyprun records the seed as stopped early, not as an error, whatever the exit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNAL = signal.SIGTERM
"""A stop request to a subprocess: what `scancel` sends too, so a Slurm job reads alike."""
EXIT_STOPPED = 75


class StopRequested(SystemExit):
    """Raised in an app that hyprun asked to stop and that has no probe to honour the ask."""

    def __init__(self) -> None:
        super().__init__(EXIT_STOPPED)


_flag = threading.Event()
_honouring: set[int] = set()  # ids of the probes that will end the loop at a step boundary


def requested() -> bool:
    """Whether hyprun asked this process's app to stop."""
    return _flag.is_set()


def honour(owner: object) -> None:
    """`owner` (a probe) ends the loop at its next step boundary once a stop is requested."""
    _honouring.add(id(owner))


def release(owner: object) -> None:
    _honouring.discard(id(owner))


def request() -> None:
    """Ask the app running in this process to stop (from hyprun's watch thread)."""
    _flag.set()


def _handle(signum: int, frame: object) -> None:
    _flag.set()
    if not _honouring:
        raise StopRequested()


def listen() -> None:
    """Handle stop requests for the rest of this process (an app's own subprocess)."""
    signal.signal(SIGNAL, _handle)


@contextmanager
def listening() -> Iterator[None]:
    """A fresh flag for an app run in this process; its probes are the only ones counted."""
    _flag.clear()
    _honouring.clear()  # the probes of an app run before, closed or not, are not this app's
    try:
        yield
    finally:
        _flag.clear()
        _honouring.clear()
