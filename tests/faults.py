"""Faults planted through the user-model door (`model._target_`), for tests and benchmarks."""

from __future__ import annotations

import torch

from runner.models import GPT


class GPTWithNaN(GPT):
    """The built-in GPT with one parameter holding a NaN: a numerical fault with a known origin."""

    def __init__(self, nan_parameter: str, **kwargs):
        super().__init__(**kwargs)
        with torch.no_grad():
            self.get_parameter(nan_parameter).view(-1)[0] = float("nan")


class GPTWithSharpAttention(GPT):
    """Query weights scaled up: attention logits so large that each row attends to one key."""

    def __init__(self, q_scale: float, **kwargs):
        super().__init__(**kwargs)
        with torch.no_grad():
            for block in self.blocks:
                d = block.attn.qkv.out_features // 3
                block.attn.qkv.weight[:d] *= q_scale


class GPTWithBiasedRouter(GPT):
    """Every MoE router starts with a strong preference for expert 0: a collapsed router."""

    def __init__(self, router_bias: float, **kwargs):
        super().__init__(**kwargs)
        for block in self.blocks:
            old = block.mlp.router
            block.mlp.router = torch.nn.Linear(old.in_features, old.out_features, bias=True)
            with torch.no_grad():
                block.mlp.router.weight.copy_(old.weight)
                block.mlp.router.bias.zero_()
                block.mlp.router.bias[0] = router_bias


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
