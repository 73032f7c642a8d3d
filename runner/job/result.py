"""What a job hands back to whoever launched it: the run it recorded and how it ended.

Kept apart from the job itself so the controller and the CLI read results without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobResult:
    run_id: str
    status: str  # completed | diverged | interrupted | stopped (early rejection)
    steps: int
    tokens: int
    train_loss: float | None
    eval_loss: float | None
    stopped_by: str | None = None
    """The signal that interrupted the job (SIGTERM, SIGUSR1, SIGUSR2), if one did."""

    def trained(self, unit: str) -> int:
        """How far the job trained, in the unit its metric's step counts (`tokens` for our
        job; an app declares `tokens` or `steps` and reports only that one)."""
        return self.steps if unit == "steps" else self.tokens
