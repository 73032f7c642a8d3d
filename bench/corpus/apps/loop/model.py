"""The corpus app's model: a tiny pre-norm causal transformer from torch's own layers."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

MASK_VALUE = -1e9
"""The large negative a binary-mask convention adds where the mask is 0 (cs249r_book PR 1785)."""


class DropoutBackwardByP(torch.autograd.Function):
    """Dropout whose forward keeps / (1 - p) and whose backward scales the kept gradients by p
    where 1 / (1 - p) belongs (bug.attention_dropout_backward_by_p, NVIDIA/apex PR 816)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep = (torch.rand_like(x) >= p).to(x.dtype)
        ctx.save_for_backward(keep)
        ctx.p = p
        return x * keep / (1.0 - p)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad * keep * ctx.p, None


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
    attention_unscaled = False
    """On (bug.attention_unscaled): attention scores q.k are not divided by sqrt(head_dim)."""
    ffn_activation_missing = False
    """On (bug.ffn_activation_missing): the feed-forward block has no nonlinearity between its
    two linear layers."""
    attention_mask_inverted = False
    """On (bug.attention_mask_inverted): the attention gets torch.triu(ones, 1).bool(), the
    positions to mask as nn.MultiheadAttention reads a bool mask, where SDPA reads True as
    may-attend: each position attends only to the tokens after it."""
    heads_merged_without_permute = False
    """On (bug.heads_merged_without_permute): the heads' outputs [B, heads, T, head_dim] are
    reshaped to [B, T, d_model] without moving the head axis back behind the positions first,
    so each position's vector is made of several positions' outputs of one head."""
    attention_softmax_over_queries = False
    """On (bug.attention_softmax_over_queries): the attention weights are normalised over the
    queries (dim=-2) instead of over the keys (dim=-1)."""
    dropout_scaled_by_p = False
    """On (bug.dropout_scaled_by_p): the embeddings' hand-written dropout divides what it keeps
    by the drop probability p instead of the keep probability 1 - p."""
    checkpoint_reentrant = False
    """On (bug.checkpoint_reentrant_frozen_inputs): each encoder layer runs under reentrant
    activation checkpointing (torch.utils.checkpoint, use_reentrant=True); with the embeddings
    frozen its input does not require grad, so the layers get no gradient."""
    encoder_not_batch_first = False
    """On (bug.encoder_not_batch_first): the encoder reads its input as (seq, batch, feature),
    torch's default batch_first=False, while the loop hands it (batch, seq, feature), and its
    causal mask is sized by x.size(0) as a sequence-first tutorial sizes it: attention runs
    across the batch's rows at each position, not across a row's positions."""
    mask_after_softmax = False
    """On (bug.attention_mask_after_softmax): the attention's softmax runs over every key and the
    causal mask is applied to its output, masked_fill(-inf) on the probabilities, instead of to
    the scores before it."""
    ffn_output_discarded = False
    """On (bug.ffn_output_discarded): the feed-forward sublayer's dropout is applied to its input
    instead of to its output, so the block adds dropout(input) to the stream and the two linear
    layers' output is thrown away."""
    mask_diagonal = False
    """On (bug.causal_mask_diagonal_masked): the causal mask's -inf is written at
    torch.triu_indices(t, t, offset=0), the diagonal included, so no position may attend to
    itself and the first position's scores are all -inf before the softmax."""
    blocks = None
    """Set (bug.layers_in_plain_list): the encoder layers held in a plain Python list instead of
    the encoder's ModuleList, run in order; nn.Module does not register them."""
    mask_convention_mismatch = False
    """On (bug.attention_mask_convention_mismatch): the additive causal mask (0 where a key may be
    read, -inf where not) is handed to a masking step written for a binary one (1 attend, 0
    block), scores + (1 - mask) * MASK_VALUE."""
    heads_share_projection = False
    """On (bug.heads_share_projection): the layer input is split into heads first, and each head's
    slice is projected to q, k and v by one head_dim x head_dim map shared by every head (the
    layer's `shared_qkv`), instead of projecting the whole input per head."""

    attention_scale_inverted = False
    """On (bug.attention_scale_inverted): the scale is written as head_dim ** -0.5 and the scores
    are divided by it, so q.k is multiplied by sqrt(head_dim) instead of divided."""
    causal_train_only = False
    """On (bug.causal_mask_train_only): the causal mask is applied only while training
    (is_causal = self.training), so in eval mode each position sees the tokens after it."""
    logits_relu = False
    """On (bug.logits_relu): a ReLU after the head, so every negative logit reads 0 and gets no
    gradient (an nn.ReLU() left at the end of the Sequential, before nn.CrossEntropyLoss)."""
    attention_dropout_unused = False
    """On (bug.attention_dropout_unused): the attention's dropout on its weights is created but
    never applied, so the attention weights are never dropped in training."""
    mask_float_added = False
    """On (bug.causal_mask_float_added): the causal mask is built as a float 0/1 matrix (1 where a
    key may be read, 0 where not) and handed to an attention that adds a non-boolean mask to the
    scores, so every past key gets +1 and no future key is blocked."""

    dropout_zeroed_by_eval = False
    """On (bug.attention_dropout_zeroed_by_eval): the attention sets its own dropout rate to 0 when
    it runs in eval mode (`if not self.training: self.dropout_p = 0`), written to the module, so
    after the first evaluation the attention weights are never dropped again in training."""

    softmax_across_heads = False
    """On (bug.attention_softmax_across_heads): the attention scores of every head are flattened
    into one row per query and normalised together (softmax over heads x keys), so each head's
    weights over the keys sum to its share of one instead of to one."""

    dropout_after_residual = False
    """On (bug.dropout_after_residual_add): each sublayer's dropout is applied to the sum of the
    residual stream and the sublayer's output, x = dropout(x + sublayer(x)), instead of to the
    sublayer's output before the add, so the residual stream itself is dropped at every layer."""

    residual_dropout_discarded = False
    """On (bug.residual_dropout_not_assigned): each sublayer's output dropout is called out of place
    and its result never assigned (`F.dropout(dx, p)` for `dx = F.dropout(dx, p)`), so the
    attention's and the feed-forward block's outputs reach the residual stream undropped."""

    emb_dropout_twice = False
    """On (bug.emb_dropout_applied_twice): the embeddings' dropout is called a second time on its
    own output (`x = self.inp_drop(x)` left in twice), so each embedding value is dropped with
    probability 1 - (1 - p) ** 2 instead of p."""

    pos_emb_detached = False
    """On (bug.pos_emb_read_through_data): the position embedding is added as its weight's
    `.data`, a tensor detached from the graph, so no gradient reaches it and the learned
    positions stay at their initial draw."""

    ffn_norm_shared = False
    """On (bug.ffn_norm_shared): each layer's feed-forward sublayer reads its input through the
    attention sublayer's LayerNorm (norm1) instead of its own (norm2), so one norm's gain and bias
    serve both sublayers and the feed-forward block's own norm is never used."""

    attention_scaled_by_num_heads = False
    """On (bug.attention_scaled_by_num_heads): the attention scores are scaled by
    num_heads ** -0.5 instead of head_dim ** -0.5, so q.k is divided by sqrt(2), not sqrt(32)."""

    tok_emb_scaled_twice = False
    """On (bug.tok_emb_scaled_twice): the token embeddings are multiplied by sqrt(d_model) once
    more than the model's design has them (a normalizer copied by hand over an embedding that
    applies its own), so they reach the stream sqrt(d_model) = 8 times larger than the position
    embeddings added to them."""

    out_proj_discarded = False
    """On (bug.attention_out_proj_discarded): the attention computes its output projection and
    returns the merged heads instead (`return output` for `return linear_proj`), so the
    projection's result is thrown away and the heads reach the residual stream unprojected."""
    value_from_key = False
    """On (bug.value_uses_key_projection): the values are projected with the keys' weights,
    value = self.k_proj(value) for self.v_proj(value), so the values are the keys themselves and
    the value projection never trains (yflyzhang/AnnotatedTransformer#1)."""
    dropout_backward_by_p = False
    """On (bug.attention_dropout_backward_by_p): the attention weights' dropout is a hand-written
    autograd function whose forward keeps / (1 - p) but whose backward scales the kept gradients
    by p, so every gradient through the attention weights is p (1 - p) times what it should be
    (NVIDIA/apex PR 816, the fast multihead attention's dropout)."""
    layers_not_chained = False
    """On (bug.layers_not_chained): the encoder's loop feeds every layer the embeddings
    (`sources = layer(query, ...)` / `x = self.enc_layers[i](embedding)`) instead of the previous
    layer's output, so only the last layer's output reaches the head and every earlier layer's
    output is overwritten, its weights never reached by a gradient."""
    pos_emb_redrawn = False
    """On (bug.pos_emb_recreated_each_forward): the position embedding is created in forward,
    `nn.Parameter(torch.randn(...))` at every call, so each pass adds a fresh N(0, 1) draw
    (nn.Embedding's init) in the learned table's place: the positions are noise that changes
    every step, and the registered table is never used or trained."""
    attention_scaled_after_softmax = False
    """On (bug.attention_scaled_after_softmax): the 1 / sqrt(head_dim) scale multiplies the
    softmax's output instead of its input, `att = F.softmax(energy, dim=-1) * self.scaling`, so the
    scores enter the softmax unscaled and every row of attention weights sums to
    1 / sqrt(head_dim) instead of 1."""

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
        if self.pos_emb_redrawn:  # self.rel_h = nn.Parameter(torch.randn(...)) inside forward:
            pos = torch.randn(t, self.pos_emb.embedding_dim, device=x.device)  # a fresh draw
            h = self.tok_emb(x) + pos  # each call (leaderj1001/Stand-Alone-Self-Attention#2)
        elif self.pos_emb_detached:  # X + self.pos_embedding.data[:, :X.shape[1], :]: detached,
            h = self.tok_emb(x) + self.pos_emb.weight.data[:t]  # so it never trains (d2l PR 2121)
        elif self.tok_emb_scaled_twice:  # lang_emb * math.sqrt(lang_emb_dim) over an embedding
            tokens = self.tok_emb(x) * self.tok_emb.embedding_dim**0.5  # that already scales
            h = tokens + self.pos_emb(torch.arange(t, device=x.device))  # (OpenTau PR 179)
        else:
            h = self.tok_emb(x) + self.pos_emb(torch.arange(t, device=x.device))
        if self.emb_dropout and self.dropout_scaled_by_p:  # kept / p, not / (1 - p)
            if self.training:  # (lmjohns3/theanets PR 123); evaluation: the identity
                h = h * (torch.rand_like(h) >= self.emb_dropout) / self.emb_dropout
        elif self.emb_dropout and self.dropout_ignores_eval:  # training= defaults to True
            h = F.dropout(h, self.emb_dropout)  # rixwew/pytorch-fm#21, pytorch#26338
        elif self.emb_dropout:
            h = F.dropout(h, self.emb_dropout, training=self.training)
            if self.emb_dropout_twice:  # x = self.inp_drop(x) a second time (ConvE#19)
                h = F.dropout(h, self.emb_dropout, training=self.training)
        if self.residual_overwritten:  # kyegomez/BitNet#32: x = attn(x); x = x + x
            for layer in self.encoder.layers:
                h = layer._sa_block(layer.norm1(h), self.mask[:t, :t], None, is_causal=True)
                h = h + h
                h = h + layer._ff_block(layer.norm2(h))
        elif self.checkpoint_reentrant:  # gradient checkpointing, reentrant: with frozen inputs
            for layer in self.encoder.layers:  # no gradient reaches the layers (transformers#21381)
                h = checkpoint(self.checkpointed(layer, self.mask[:t, :t]), h, use_reentrant=True)
        elif self.encoder_not_batch_first:  # batch_first left False (Exorust/TorchLeet#5):
            rows = h.shape[0]  # dim 0 (the batch) read as the sequence, its mask sized by it
            mask = nn.Transformer.generate_square_subsequent_mask(rows, device=h.device)
            h = self.encoder(h.transpose(0, 1), mask=mask, is_causal=True).transpose(0, 1)
        elif self.layers_not_chained:  # for layer in layers: out = layer(embedding): each layer
            embedded = h  # reads the embeddings, only the last one's output is kept
            for layer in self.encoder.layers:  # (simon-ging/coot-videotext#5, HawkesKT#4)
                h = layer(embedded, src_mask=self.mask[:t, :t], is_causal=True)
        elif self.blocks is not None:  # self.layers = [...]: a list, never registered
            for layer in self.blocks:  # (pytorch/pytorch#59925, #715)
                h = layer(h, src_mask=self.mask[:t, :t], is_causal=True)
        elif self.layers_by_hand:
            for layer in self.encoder.layers:
                h = self.layer_by_hand(layer, h, self.mask[:t, :t])
        elif self.causal_train_only:  # is_causal_flag = self.training (shiyu-coder/Kronos#199):
            mask = self.mask[:t, :t] if self.training else None  # eval reads the full context
            h = self.encoder(h, mask=mask, is_causal=self.training)
        elif self.causal:
            h = self.encoder(h, mask=self.mask[:t, :t], is_causal=True)
        else:  # no src mask, as in pytorch/tutorials#2478: the next token is in view
            h = self.encoder(h)
        if self.encoder_output_detached:  # lucidrains/CoCa-pytorch#6: no gradient reaches it
            h = h.detach()
        if self.layer_norm_wrong_dim:  # normalized_shape = every dim but the batch
            h = F.layer_norm(h, h.shape[1:], eps=self.ln_f.eps)  # (geometric-algebra-transformer#8)
            return self.head(h * self.ln_f.weight + self.ln_f.bias)
        if self.logits_relu:  # Linear(512, 10), ReLU(): logits clipped at 0 (tutorials#1526)
            return F.relu(self.head(self.ln_f(h))).float()
        return self.head(self.ln_f(h)).float()  # logits upcast for the loss (bf16 weights)

    @staticmethod
    def checkpointed(layer: nn.TransformerEncoderLayer, mask):
        """The layer as nn.TransformerEncoder calls it, as one function of its input."""
        return lambda h: layer(h, src_mask=mask, is_causal=True)

    @property
    def layers_by_hand(self) -> bool:
        """A bug flag that changes a line inside the encoder layers is on."""
        flags = (
            self.attention_unscaled,
            self.ffn_activation_missing,
            self.attention_mask_inverted,
            self.heads_merged_without_permute,
            self.attention_softmax_over_queries,
            self.mask_after_softmax,
            self.ffn_output_discarded,
            self.mask_diagonal,
            self.mask_convention_mismatch,
            self.heads_share_projection,
            self.attention_scale_inverted,
            self.attention_dropout_unused,
            self.mask_float_added,
            self.dropout_after_residual,
            self.dropout_zeroed_by_eval,
            self.softmax_across_heads,
            self.residual_dropout_discarded,
            self.ffn_norm_shared,
            self.attention_scaled_by_num_heads,
            self.out_proj_discarded,
            self.value_from_key,
            self.dropout_backward_by_p,
            self.attention_scaled_after_softmax,
        )
        return any(flags)

    def layer_by_hand(self, layer: nn.TransformerEncoderLayer, h, mask) -> torch.Tensor:
        """One pre-norm encoder layer written out (torch's own, norm_first), with the lines
        the bug flags change."""
        if self.dropout_after_residual:  # x = dropout(x + sublayer(x)): the dropout after the add,
            h = layer.dropout1(h + self.attention(layer, layer.norm1(h), mask))  # on the stream
            ff = layer.linear2(layer.dropout(layer.activation(layer.linear1(layer.norm2(h)))))
            return layer.dropout2(h + ff)  # (hyunwoongko/transformer#8, BERT-pytorch#85)
        h = h + self.attention(layer, layer.norm1(h), mask)
        if self.ffn_norm_shared:  # self.ff_proj(self.norm(x)): the attention's norm reused for
            return h + self.feed_forward(layer, layer.norm1(h))  # the feed-forward block
            # (allenai/OLMo#222, lucidrains/mmdit#4)
        return h + self.feed_forward(layer, layer.norm2(h))

    def attention(self, layer: nn.TransformerEncoderLayer, h, mask) -> torch.Tensor:
        """Causal multi-head self-attention with the layer's weights (its _sa_block)."""
        by_hand = (
            self.attention_unscaled,
            self.attention_mask_inverted,
            self.heads_merged_without_permute,
            self.attention_softmax_over_queries,
            self.mask_after_softmax,
            self.mask_diagonal,
            self.mask_convention_mismatch,
            self.heads_share_projection,
            self.attention_scale_inverted,
            self.attention_dropout_unused,
            self.mask_float_added,
            self.dropout_after_residual,
            self.dropout_zeroed_by_eval,
            self.softmax_across_heads,
            self.residual_dropout_discarded,
            self.attention_scaled_by_num_heads,
            self.out_proj_discarded,
            self.value_from_key,
            self.dropout_backward_by_p,
            self.attention_scaled_after_softmax,
        )
        if not any(by_hand):
            return layer._sa_block(h, mask, None, is_causal=True)
        attn = layer.self_attn
        b, t, d = h.shape
        heads = attn.num_heads
        if self.heads_share_projection:  # x.reshape(N, L, heads, head_size), then one
            pieces = h.reshape(b, t, heads, d // heads)  # Linear(head_size, head_size) for all
            q, k, v = (  # heads (MarcoMeter/episodic-transformer-memory-ppo PR 22)
                layer.shared_qkv[name](pieces).transpose(1, 2) for name in ("q", "k", "v")
            )
        elif self.value_from_key:  # value = self.k_proj(value): the keys' weights project the
            w_q, w_k, _ = attn.in_proj_weight.chunk(3)  # values as well
            b_q, b_k, _ = attn.in_proj_bias.chunk(3)  # (yflyzhang/AnnotatedTransformer#1)
            q, k, v = F.linear(h, w_q, b_q), F.linear(h, w_k, b_k), F.linear(h, w_k, b_k)
            q, k, v = (z.reshape(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
        else:
            q, k, v = F.linear(h, attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)
            q, k, v = (z.reshape(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
        if self.dropout_zeroed_by_eval and not self.training:  # if not self.training:
            attn.dropout = 0.0  # self.dropout_p = 0, on the module: it stays 0 once training
            # resumes (NVIDIA/Megatron-LM PR 411, FlashSelfAttention)
        drop = attn.dropout if self.training else 0.0
        if self.attention_dropout_unused:  # self.dropout = nn.Dropout(p) built, never called on
            drop = 0.0  # the attention weights (zhouhaoyi/Informer2020#97)
        if self.mask_convention_mismatch:  # _apply_mask(scores, mask) written for 1 = attend,
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // heads)  # given the additive
            scores = scores + (1 - mask) * MASK_VALUE  # 0 / -inf mask (cs249r_book PR 1785):
            out = F.dropout(scores.softmax(dim=-1), drop) @ v  # every readable key gets -1e9
        elif self.attention_mask_inverted:  # the mask of the future, read as the keys allowed
            future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=h.device), diagonal=1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=future, dropout_p=drop)
        elif self.attention_softmax_over_queries:  # softmax(dim=-2): each key's column sums
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // heads) + mask  # to 1 over the
            weights = F.dropout(scores.softmax(dim=-2), drop)  # queries (labmlai/...#146)
            out = weights @ v
        elif self.softmax_across_heads:  # F.softmax(weights.flatten(2), dim=-1) on [b, q, heads,
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // heads) + mask  # keys]: one softmax
            rows = scores.transpose(1, 2).reshape(b, t, heads * t)  # over every head's keys
            weights = rows.softmax(dim=-1).reshape(b, t, heads, t).transpose(1, 2)  # together
            out = F.dropout(weights, drop) @ v  # (facebookresearch/detr#247)
        elif self.mask_after_softmax:  # softmax, then masked_fill(~mask, -inf) on its output
            future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=h.device), diagonal=1)
            weights = (q @ k.transpose(-2, -1) / math.sqrt(d // heads)).softmax(dim=-1)
            weights = F.dropout(weights.masked_fill(future, float("-inf")), drop)  # (timm PR 2236)
            out = weights @ v
        elif self.mask_diagonal:  # indices = torch.triu_indices(t, t, offset=0); dot[..., indices]
            rows, cols = torch.triu_indices(t, t, offset=0, device=h.device)  # = -inf; softmax
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // heads)  # (pbloem/former#10)
            scores[..., rows, cols] = float("-inf")
            out = F.dropout(scores.softmax(dim=-1), drop) @ v
        elif self.mask_float_added:  # mask = torch.ones(t, t).tril(), a float mask, which the
            allowed = torch.ones(t, t, device=h.device).tril()  # attention adds to its scores
            # (a bool one it fills with -inf): +0 on the future keys (timeseriesAI/tsai#171)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=drop)
        elif self.dropout_backward_by_p:  # the fast attention's dropout: forward / (1 - p),
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // heads) + mask  # backward x p
            out = DropoutBackwardByP.apply(scores.softmax(dim=-1), drop) @ v  # (apex PR 816)
        elif self.attention_scaled_after_softmax:  # att = F.softmax(energy, dim=-1) * scaling:
            scores = q @ k.transpose(-2, -1) + mask  # the scale applied to the weights, not the
            weights = scores.softmax(dim=-1) * (d // heads) ** -0.5  # scores
            out = F.dropout(weights, drop) @ v  # (FrancescoSaverioZuppichini/ViT#2)
        elif self.attention_unscaled:  # scale=1.0: q.k not divided by sqrt(head_dim)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop, scale=1.0)
        elif self.attention_scaled_by_num_heads:  # scale = 1 / sqrt(num_heads), where its own
            by_heads = heads**-0.5  # comment says 1 / sqrt(head_dim) (tenstorrent/tt-metal PR
            out = F.scaled_dot_product_attention(  # 56789)
                q, k, v, attn_mask=mask, dropout_p=drop, scale=by_heads
            )
        elif self.attention_scale_inverted:  # self.scale = head_dim ** -0.5, then q.k / self.scale:
            inverted = 1.0 / (d // heads) ** -0.5  # x sqrt(head_dim) (esceptico/perceiver-io#9)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=drop, scale=inverted
            )
        else:  # (PAIR-code/tiny-transformers#71 above); the rest as torch computes it
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
        if self.heads_merged_without_permute:  # [B, heads, T, hd] reshaped as it lies in memory
            return layer.dropout1(attn.out_proj(out.reshape(b, t, d)))  # (jsbaan/...#6)
        if self.out_proj_discarded:  # linear_proj = self.linear(output); return output: the
            merged = out.transpose(1, 2).reshape(b, t, d)  # projection computed, its result
            attn.out_proj(merged)  # never used (ethen8181/machine-learning#13)
            return layer.dropout1(merged)
        out = attn.out_proj(out.transpose(1, 2).reshape(b, t, d))
        if self.dropout_after_residual:  # no dropout on the output: it comes after the add
            return out
        if self.residual_dropout_discarded:  # F.dropout(dx, p): an out-of-place call whose result
            layer.dropout1(out)  # is never assigned, so dx reaches the stream undropped
            return out  # (evintunador/templateGPT#1)
        return layer.dropout1(out)

    def feed_forward(self, layer: nn.TransformerEncoderLayer, h) -> torch.Tensor:
        """The layer's feed-forward block (its _ff_block)."""
        if self.ffn_output_discarded:  # z_ = act(Dense(z)); z_ = Dropout(z): the wrong
            layer.linear2(layer.dropout(layer.activation(layer.linear1(h))))  # variable, its
            return layer.dropout2(h)  # output thrown away (theislab/CellFlow PR 296)
        if self.residual_dropout_discarded:  # F.dropout(dx, p), its result never assigned
            dx = layer.linear2(layer.dropout(layer.activation(layer.linear1(h))))
            layer.dropout2(dx)  # (evintunador/templateGPT#1)
            return dx
        if self.ffn_activation_missing:  # Linear, dropout, Linear: no ReLU (YujiaBao/ls#1)
            return layer.dropout2(layer.linear2(layer.dropout(layer.linear1(h))))
        return layer._ff_block(h)
