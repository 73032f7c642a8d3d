"""Faults planted through the user-model door (`model._target_`), for tests and benchmarks."""

from __future__ import annotations

import torch

from bench.diagnosis.faults import GPTWithBiasedRouter, GPTWithNaNAt, GPTWithSharpAttention
from hyprun.runner.job.models import GPT

__all__ = [
    "GPTWithBiasedRouter",
    "GPTWithNaN",
    "GPTWithNaNAt",
    "GPTWithSharpAttention",
    "GPTWithoutResiduals",
]


class GPTWithNaN(GPT):
    """The built-in GPT with one parameter holding a NaN: a numerical fault with a known origin."""

    def __init__(self, nan_parameter: str, **kwargs):
        super().__init__(**kwargs)
        with torch.no_grad():
            self.get_parameter(nan_parameter).view(-1)[0] = float("nan")


class GPTWithoutResiduals(GPT):
    """Blocks that replace the residual stream instead of adding to it (a forgotten `x +`):
    gradients must cross every layer's Jacobian and fade on the way to the first layers."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        for block in self.blocks:
            block.forward = _replacing_forward(block)


def _replacing_forward(block):
    def forward(x: torch.Tensor) -> torch.Tensor:
        x = block.attn(block.norm1(x))
        return block.mlp(block.norm2(x))

    return forward
