"""Faults planted through the user-model door (`model._target_=bench.diagnosis.faults.X`).

Planted-fault models shared with the test suite (tests/faults.py imports them from here), plus
one numerical fault that only low precision exposes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hyprun.runner.job.models import GPT


class GPTWithSharpAttention(GPT):
    """Query weights scaled up: attention logits so large that each row attends to one key."""

    def __init__(self, q_scale: float, **kwargs) -> None:
        super().__init__(**kwargs)
        with torch.no_grad():
            for block in self.blocks:
                d = block.attn.qkv.out_features // 3
                block.attn.qkv.weight[:d] *= q_scale


class GPTWithBiasedRouter(GPT):
    """Every MoE router starts with a strong preference for expert 0: a collapsed router."""

    def __init__(self, router_bias: float, **kwargs) -> None:
        super().__init__(**kwargs)
        for block in self.blocks:
            old = block.mlp.router
            block.mlp.router = nn.Linear(old.in_features, old.out_features, bias=True)
            with torch.no_grad():
                block.mlp.router.weight.copy_(old.weight)
                block.mlp.router.bias.zero_()
                block.mlp.router.bias[0] = router_bias


class GPTWithNaNAt(GPT):
    """A NaN that appears in the middle of training: one element of `nan_parameter` turns NaN
    just before the `at_forward`-th training forward (1-based, counting micro-steps)."""

    def __init__(self, nan_parameter: str, at_forward: int, **kwargs):
        super().__init__(**kwargs)
        self.nan_parameter, self.at_forward, self.forwards = nan_parameter, at_forward, 0

    def forward(self, input_ids, targets):
        if self.training:
            self.forwards += 1
            if self.forwards == self.at_forward:
                with torch.no_grad():
                    self.get_parameter(self.nan_parameter).view(-1)[0] = float("nan")
        return super().forward(input_ids, targets)


class OnePassLayerNorm(nn.Module):
    """LayerNorm with the one-pass variance E[x^2] - E[x]^2, computed in the input's dtype and
    without epsilon, on an input shifted by a constant `offset`.

    LayerNorm is shift-invariant, so in exact arithmetic (and in fp32) the offset changes nothing.
    In bf16 (8 significant bits) E[x^2] and E[x]^2 of a shifted row round to the same value, so
    the variance comes out 0 or negative and the output is Inf/NaN: catastrophic cancellation,
    a fault that only low precision exposes."""

    def __init__(self, dim: int, offset: float) -> None:
        super().__init__()
        self.offset = offset
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.offset
        mean = x.mean(dim=-1, keepdim=True)
        var = (x * x).mean(dim=-1, keepdim=True) - mean * mean
        return (x - mean) / torch.sqrt(var) * self.weight


class GPTWithOnePassNorm(GPT):
    """Every LayerNorm replaced by OnePassLayerNorm: healthy in fp32, NaN in bf16."""

    def __init__(self, norm_offset: float, **kwargs) -> None:
        super().__init__(**kwargs)
        d_model = self.tok_emb.weight.shape[1]
        for block in self.blocks:
            block.norm1 = OnePassLayerNorm(d_model, norm_offset)
            block.norm2 = OnePassLayerNorm(d_model, norm_offset)
        if isinstance(self.norm_f, nn.LayerNorm):
            self.norm_f = OnePassLayerNorm(d_model, norm_offset)
