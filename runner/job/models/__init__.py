"""Model definitions buildable by Hydra (``_target_: runner.job.models.GPT``)."""

from runner.job.models.gpt import GPT

__all__ = ["GPT"]
