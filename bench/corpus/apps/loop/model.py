"""The corpus app's model: a tiny pre-norm causal transformer from torch's own layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TinyLM(nn.Module):
    """Token and position embeddings, `n_layer` pre-norm encoder layers under a causal mask,
    a final LayerNorm and a linear head; forward returns logits [B, T, vocab].

    `emb_dropout` > 0 adds functional dropout on the embeddings. The bug flags below are set
    by the loop's build() from its switches; all off is the clean model."""

    causal = True
    """Off (bug.causal_mask_missing): no mask, so each position sees the tokens after it."""
    dropout_ignores_eval = False
    """On (bug.dropout_ignores_eval): F.dropout without training=, so it drops in eval too."""
    encoder_output_detached = False
    """On (bug.encoder_output_detached): the encoder's output is detached from the graph."""
    residual_overwritten = False
    """On (bug.residual_overwritten): each layer's attention output replaces the residual stream
    and is added to itself (`x = x + x`), so the stream before it is lost."""
    layer_norm_wrong_dim = False
    """On (bug.layer_norm_wrong_dim): the final LayerNorm normalises over the sequence and the
    features together, not over the features of each position."""

    def __init__(
        self,
        vocab: int,
        seq_len: int,
        n_layer: int,
        d_model: int,
        n_head: int,
        dropout: float,
        emb_dropout: float = 0.0,
    ):
        super().__init__()
        self.emb_dropout = emb_dropout
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
        if self.emb_dropout and self.dropout_ignores_eval:  # training= defaults to True
            h = F.dropout(h, self.emb_dropout)  # rixwew/pytorch-fm#21, pytorch#26338
        elif self.emb_dropout:
            h = F.dropout(h, self.emb_dropout, training=self.training)
        if self.residual_overwritten:  # kyegomez/BitNet#32: x = attn(x); x = x + x
            for layer in self.encoder.layers:
                h = layer._sa_block(layer.norm1(h), self.mask[:t, :t], None, is_causal=True)
                h = h + h
                h = h + layer._ff_block(layer.norm2(h))
        elif self.causal:
            h = self.encoder(h, mask=self.mask[:t, :t], is_causal=True)
        else:  # no src mask, as in pytorch/tutorials#2478: the next token is in view
            h = self.encoder(h)
        if self.encoder_output_detached:  # lucidrains/CoCa-pytorch#6: no gradient reaches it
            h = h.detach()
        if self.layer_norm_wrong_dim:  # normalized_shape = every dim but the batch
            h = F.layer_norm(h, h.shape[1:], eps=self.ln_f.eps)  # (geometric-algebra-transformer#8)
            return self.head(h * self.ln_f.weight + self.ln_f.bias)
        return self.head(self.ln_f(h))
