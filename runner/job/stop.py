"""hyprun's request that an app's seed stop early (early rejection), as the app sees it.

The contract, for any app hyprun runs:

- hyprun asks by SIGTERM: to the app's process when it runs in a subprocess (a Slurm job gets
  it from `scancel`), to its own main thread when the app runs in hyprun's process (there
  only where no `Probe` would see the flag). From then on `requested()` is True.
- A `Probe` (and so `HyprunTrainerCallback` and `HyprunLightningCallback`) *honours* the request:
  the loop ends at the next optimizer-step boundary. The callbacks stop their trainer
  (`control.should_training_stop`, `trainer.should_stop`); a plain loop reads
  `probe.should_stop` after each step (`if probe.should_stop: break`), and one that steps on
  anyway gets `StopRequested` from the probe's next `after_step`.
- An app with no probe gets `StopRequested` at once, where the signal finds it.

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
"""What a stop request is delivered as: what `scancel` sends too, so a Slurm job reads alike."""
EXIT_STOPPED = 75


class StopRequested(SystemExit):
    """Raised in an app that hyprun asked to stop and that has no probe to honour the ask."""

    def __init__(self) -> None:
        super().__init__(EXIT_STOPPED)


_flag = threading.Event()
_honouring: set[int] = set()  # ids of the probes that will end the loop at a step boundary
_listening = False  # our handler is installed in this process's main thread
_asked = False  # hyprun's watcher asked (not a SIGTERM from elsewhere)
_lock = threading.Lock()  # a signal is only sent while our handler is the one installed


def requested() -> bool:
    """Whether hyprun asked this process's app to stop."""
    return _flag.is_set()


def honour(owner: object) -> None:
    """`owner` (a probe) ends the loop at its next step boundary once a stop is requested."""
    _honouring.add(id(owner))


def release(owner: object) -> None:
    _honouring.discard(id(owner))


def request() -> None:
    """Ask the app running in this process to stop (from hyprun's watcher thread): the flag for
    a probe; with none, the signal to the main thread, whose handler raises `StopRequested`."""
    global _asked
    with _lock:
        _asked = True
        _flag.set()
        if not _honouring and _listening:
            signal.pthread_kill(threading.main_thread().ident, SIGNAL)


def _handle(signum: int, frame: object) -> None:
    _flag.set()
    if not _honouring:
        raise StopRequested()


def listen() -> None:
    """Handle stop requests for the rest of this process (an app's own subprocess)."""
    global _listening
    signal.signal(SIGNAL, _handle)
    _listening = True


@contextmanager
def listening() -> Iterator[None]:
    """Handle stop requests while an app runs in this process (main thread only: elsewhere only
    a probe sees the flag). A SIGTERM hyprun did not send (the user's `kill`) is passed on to the
    handler it replaced once the app has unwound."""
    global _listening, _asked
    _flag.clear()
    _asked = False
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(SIGNAL, _handle)
    _listening = True
    try:
        yield
    finally:
        with _lock:
            _listening = False
            signal.signal(SIGNAL, previous)
        from_elsewhere = _flag.is_set() and not _asked
        _flag.clear()
        if from_elsewhere:
            signal.raise_signal(SIGNAL)
