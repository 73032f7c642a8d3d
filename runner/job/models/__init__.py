"""Model definitions buildable by Hydra (``_target_: hyprun.runner.job.models.GPT``)."""

from hyprun.runner.job.models.gpt import GPT

__all__ = ["GPT"]
