"""Model definitions buildable by Hydra (``_target_: runner.models.GPT``)."""

from runner.models.gpt import GPT

__all__ = ["GPT"]
