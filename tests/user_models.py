"""Models written the way a user writes them: strict constructors, their own argument names."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class StrictLM(nn.Module):
    """A residual MLP language model whose constructor takes only its own arguments."""

    def __init__(self, vocab_size: int, seq_len: int, width: int = 32, layers: int = 2):
        super().__init__()
        self.width = width
        self.embed = nn.Embedding(vocab_size, width)
        self.pos = nn.Parameter(torch.zeros(seq_len, width))
        self.blocks = nn.ModuleList([Block(width) for _ in range(layers)])
        self.head = nn.Linear(width, vocab_size)

    def forward(self, input_ids, targets):
        x = self.embed(input_ids) + self.pos[: input_ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


class NeedsDepth(StrictLM):
    """A constructor with a required argument the job's config does not have."""

    def __init__(self, vocab_size: int, seq_len: int, depth: int):
        super().__init__(vocab_size, seq_len, layers=depth)
