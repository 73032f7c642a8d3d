"""The corpus app's model: a tiny pre-norm causal transformer from torch's own layers."""

from __future__ import annotations

import torch
from torch import nn


class TinyLM(nn.Module):
    """Token and position embeddings, `n_layer` pre-norm encoder layers under a causal mask,
    a final LayerNorm and a linear head; forward returns logits [B, T, vocab]."""

    def __init__(
        self, vocab: int, seq_len: int, n_layer: int, d_model: int, n_head: int, dropout: float
    ):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, n_head, 4 * d_model, dropout, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tok_emb(x) + self.pos_emb(torch.arange(t, device=x.device))
        h = self.encoder(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.ln_f(h))
