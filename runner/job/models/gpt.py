"""Decoder-only GPT in plain torch, configurable enough to run architecture ablations.

The switches (norm type and placement, MLP type, positional scheme, MoE) are plain keyword
arguments so that Hydra can build the model with
``_target_: hyprun.runner.job.models.GPT``. Diagnostics
(attention entropy, MoE load) are opt-in attributes that cost nothing while switched off.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

NORMS = ("layernorm", "rmsnorm")
PLACEMENTS = ("pre", "post")
MLPS = ("gelu", "swiglu")
POSITIONS = ("learned", "rope")
IGNORE_INDEX = -100


def default_d_ff(d_model: int, mlp: str) -> int:
    """Hidden width of the MLP when none is given.

    SwiGLU has three matrices instead of two, so 8/3*d keeps the parameter count equal to a
    4*d GELU MLP; rounding up to a multiple of 64 (8 for tiny models) keeps matmuls aligned.
    """
    if mlp == "gelu":
        return 4 * d_model
    multiple = 64 if d_model >= 192 else 8
    raw = -(-8 * d_model // 3)  # ceil(8/3 * d_model)
    return -(-raw // multiple) * multiple


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain (no centring, no bias).

    Defined here rather than using nn.RMSNorm, which needs torch >= 2.4; the statistics are
    taken in float32 so bf16 activations do not lose precision in the mean of squares.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


def make_norm(kind: str, dim: int, bias: bool) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim, bias=bias)
    return RMSNorm(dim)


class Rotary(nn.Module):
    """Rotary position embedding (GPT-NeoX "rotate half" layout) applied to q and k.

    cos/sin tables are plain cached tensors rather than buffers, so a model built on the meta
    device (or moved with ``to_empty``) never carries uninitialised tables.
    """

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self._cache: tuple[int, torch.device, torch.dtype, Tensor, Tensor] | None = None

    def _tables(self, T: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        c = self._cache
        if c is None or c[0] < T or c[1] != device or c[2] != dtype:
            half = torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float32)
            inv_freq = 1.0 / (self.base ** (half / self.head_dim))
            angles = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv_freq)
            angles = torch.cat((angles, angles), dim=-1)  # [T, head_dim]
            c = (T, device, dtype, angles.cos().to(dtype), angles.sin().to(dtype))
            self._cache = c
        return c[3][:T], c[4][:T]

    @staticmethod
    def _rotate_half(x: Tensor) -> Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate q, k of shape [B, H, T, head_dim] by their absolute positions 0..T-1."""
        cos, sin = self._tables(q.size(-2), q.device, q.dtype)
        q = q * cos + self._rotate_half(q) * sin
        k = k * cos + self._rotate_half(k) * sin
        return q, k


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through SDPA, with an optional entropy probe.

    Setting ``capture_heads > 0`` makes each forward also store ``last_entropy``: the mean
    normalised entropy of the explicit softmax attention of the first ``capture_heads`` heads
    on at most ``capture_rows`` query rows of the first ``capture_batch`` sequences. The probe
    is computed on the side under no_grad; the output always comes from SDPA, so switching it
    on never changes the model.
    """

    def __init__(self, d_model: int, n_head: int, rope: bool, dropout: float, bias: bool) -> None:
        super().__init__()
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = Rotary(self.head_dim) if rope else None
        self.dropout = dropout
        self.resid_drop = nn.Dropout(dropout)
        self.capture_heads: int = 0
        self.capture_rows: int = 16
        self.capture_batch: int = 4
        self.last_entropy: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        if self.rotary is not None:
            q, k = self.rotary(q, k)
        if self.capture_heads > 0:
            self.last_entropy = self._attention_entropy(q.detach(), k.detach())
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))

    @torch.no_grad()
    def _attention_entropy(self, q: Tensor, k: Tensor) -> Tensor:
        """Mean over batch and sampled rows of entropy / log(#visible keys), per head.

        Rows are evenly spaced over 1..T-1 and always include the last row; row 0 sees a single
        key, where entropy is trivially 0, so it is skipped. ``capture_heads`` above n_head is
        clamped to n_head. With T == 1 there is no usable row and the result is NaN.
        """
        h = min(self.capture_heads, self.n_head)
        T = q.size(-2)
        n_rows = min(self.capture_rows, T - 1)
        if n_rows < 1:
            return torch.full((h,), float("nan"), device=q.device)
        rows = torch.linspace(T - 1, 1, n_rows, device=q.device).round().long().unique()
        b = self.capture_batch  # a few sequences, heads and rows: a probe, not a second pass
        qs = q[:b, :h, rows].float()  # [b, h, R, Q]
        ks = k[:b, :h].float()  # [b, h, T, Q]
        scores = (qs @ ks.transpose(-1, -2)) / math.sqrt(self.head_dim)  # [B, h, R, T]
        keys = torch.arange(T, device=q.device)
        scores = scores.masked_fill(keys[None, :] > rows[:, None], float("-inf"))
        p = scores.softmax(dim=-1)
        entropy = -torch.special.xlogy(p, p).sum(dim=-1)  # [B, h, R]
        entropy = entropy / torch.log(rows.float() + 1.0)
        return entropy.mean(dim=(0, 2))


class MLP(nn.Module):
    """Position-wise feed-forward: GELU (``fc -> gelu -> proj``) or SwiGLU."""

    def __init__(self, d_model: int, d_ff: int, kind: str, dropout: float, bias: bool) -> None:
        super().__init__()
        self.kind = kind
        self.fc = nn.Linear(d_model, d_ff, bias=bias)
        self.gate = nn.Linear(d_model, d_ff, bias=bias) if kind == "swiglu" else None
        self.proj = nn.Linear(d_ff, d_model, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = F.gelu(self.fc(x)) if self.gate is None else F.silu(self.gate(x)) * self.fc(x)
        return self.drop(self.proj(h))


class MoE(nn.Module):
    """Top-k routed mixture of MLP experts with a Switch-style load-balancing loss.

    Experts run in a python loop with index_select/index_add_, which is simple and fine for
    CPU-sized models. After each forward the module holds ``aux_loss`` (with graph, collected
    by GPT.forward) and detached diagnostics ``last_load``, ``last_aux_loss`` and
    ``last_router_entropy``.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        kind: str,
        n_experts: int,
        top_k: int,
        dropout: float,
        bias: bool,
    ) -> None:
        super().__init__()
        self.n_experts = n_experts
        self.top_k = top_k
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(
            MLP(d_model, d_ff, kind, dropout, bias) for _ in range(n_experts)
        )
        self.aux_loss: Tensor | None = None
        self.last_load: Tensor | None = None
        self.last_aux_loss: Tensor | None = None
        self.last_router_entropy: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        flat = x.reshape(B * T, C)
        probs = self.router(flat).float().softmax(dim=-1)  # [N, E]
        top_w, top_i = probs.topk(self.top_k, dim=-1)  # [N, k]
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)

        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            tok, slot = (top_i == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            y = expert(flat.index_select(0, tok)) * top_w[tok, slot].unsqueeze(-1).to(flat.dtype)
            out.index_add_(0, tok, y)

        # Switch aux loss: E * sum_i f_i * P_i, f_i over all routed (token, slot) pairs, so it
        # is 1 under perfect balance and E under total collapse; gradient flows through P_i.
        counts = torch.bincount(top_i.flatten(), minlength=self.n_experts).float()
        load = counts / counts.sum()
        aux = self.n_experts * (load * probs.mean(dim=0)).sum()
        self.aux_loss = aux
        with torch.no_grad():
            self.last_load = load.detach()
            self.last_aux_loss = aux.detach()
            if self.n_experts > 1:
                ent = -torch.special.xlogy(probs, probs).sum(dim=-1).mean()
                self.last_router_entropy = ent / math.log(self.n_experts)
            else:
                self.last_router_entropy = torch.zeros((), device=x.device)
        return out.view(B, T, C)


class Block(nn.Module):
    """One transformer block; forward maps the residual stream x [B, T, C] to x [B, T, C]."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        d_ff: int,
        norm: str,
        placement: str,
        mlp: str,
        rope: bool,
        n_experts: int,
        top_k: int,
        dropout: float,
        bias: bool,
    ) -> None:
        super().__init__()
        self.post_norm = placement == "post"
        self.norm1 = make_norm(norm, d_model, bias)
        self.attn = CausalSelfAttention(d_model, n_head, rope, dropout, bias)
        self.norm2 = make_norm(norm, d_model, bias)
        self.mlp: nn.Module
        if n_experts > 0:
            self.mlp = MoE(d_model, d_ff, mlp, n_experts, top_k, dropout, bias)
        else:
            self.mlp = MLP(d_model, d_ff, mlp, dropout, bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.post_norm:
            x = self.norm1(x + self.attn(x))
            return self.norm2(x + self.mlp(x))
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; expected one of {allowed}")


def _check_positive(name: str, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer")


class GPT(nn.Module):
    """Decoder-only transformer language model; ``forward`` returns the training loss."""

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        n_layer: int,
        n_head: int,
        d_model: int,
        d_ff: int | None = None,
        norm: str = "layernorm",
        placement: str = "pre",
        mlp: str = "gelu",
        pos: str = "learned",
        n_experts: int = 0,
        top_k: int = 2,
        moe_aux_weight: float = 0.01,
        init_std: float = 0.02,
        tied_embeddings: bool = True,
        activation_checkpointing: bool = False,
        dropout: float = 0.0,
        bias: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("seq_len", seq_len),
            ("n_layer", n_layer),
            ("n_head", n_head),
            ("d_model", d_model),
        ):
            _check_positive(name, value)
        if d_model % n_head != 0:
            raise ValueError(f"d_model={d_model} must be divisible by n_head={n_head}")
        _check_choice("norm", norm, NORMS)
        _check_choice("placement", placement, PLACEMENTS)
        _check_choice("mlp", mlp, MLPS)
        _check_choice("pos", pos, POSITIONS)
        if pos == "rope" and (d_model // n_head) % 2 != 0:
            raise ValueError(
                f"pos='rope' needs an even head dim, got d_model/n_head={d_model // n_head}"
            )
        if d_ff is not None:
            _check_positive("d_ff", d_ff)
        if n_experts < 0:
            raise ValueError(f"n_experts={n_experts} must be >= 0 (0 = dense MLP)")
        if n_experts > 0 and not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k={top_k} must be in [1, n_experts={n_experts}]")
        if moe_aux_weight < 0:
            raise ValueError(f"moe_aux_weight={moe_aux_weight} must be >= 0")
        if init_std <= 0:
            raise ValueError(f"init_std={init_std} must be > 0")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout} must be in [0, 1)")

        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.n_layer = n_layer
        self.n_head = n_head
        self.d_model = d_model
        self.d_ff = d_ff if d_ff is not None else default_d_ff(d_model, mlp)
        self.pos = pos
        self.placement = placement
        self.n_experts = n_experts
        self.top_k = top_k
        self.moe_aux_weight = moe_aux_weight
        self.init_std = init_std
        self.tied_embeddings = tied_embeddings
        self.activation_checkpointing = activation_checkpointing

        self.tok_emb = nn.Embedding(vocab_size, d_model)
        if pos == "learned":
            self.pos_emb = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(
                d_model=d_model,
                n_head=n_head,
                d_ff=self.d_ff,
                norm=norm,
                placement=placement,
                mlp=mlp,
                rope=pos == "rope",
                n_experts=n_experts,
                top_k=top_k,
                dropout=dropout,
                bias=bias,
            )
            for _ in range(n_layer)
        )
        # Post-norm blocks already end in a norm, so a final norm would be redundant.
        self.norm_f = make_norm(norm, d_model, bias) if placement == "pre" else nn.Identity()
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tied_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2 init: N(0, init_std) everywhere, residual projections scaled by 1/sqrt(2L).

        The scaling keeps the residual stream's variance roughly independent of depth, since
        each block adds two (attention and MLP) outputs to it.
        """
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=self.init_std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        resid_std = self.init_std / math.sqrt(2 * self.n_layer)
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(param, mean=0.0, std=resid_std)

    def forward(self, input_ids: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy over targets != -100, plus the weighted MoE aux loss.

        The aux loss is averaged over layers, so ``moe_aux_weight`` means the same thing at
        any depth (1.0 = perfectly balanced routing in every layer).
        """
        B, T = input_ids.shape
        if self.seq_len < T:
            raise ValueError(f"input length T={T} exceeds seq_len={self.seq_len}")
        x = self.tok_emb(input_ids)
        if self.pos == "learned":
            x = x + self.pos_emb(torch.arange(T, device=input_ids.device))
        x = self.drop(x)
        use_ckpt = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        aux_losses: list[Tensor] = []
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if use_ckpt else block(x)
            if self.n_experts > 0:
                aux_losses.append(block.mlp.aux_loss)
                block.mlp.aux_loss = None  # do not keep this step's graph alive on the module
        logits = self.lm_head(self.norm_f(x))
        loss = F.cross_entropy(
            logits.view(B * T, -1).float(), targets.reshape(B * T), ignore_index=IGNORE_INDEX
        )
        if aux_losses and self.moe_aux_weight > 0:
            loss = loss + self.moe_aux_weight * torch.stack(aux_losses).mean()
        return loss

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count, tied weights counted once.

        ``non_embedding`` drops the token and position tables (and with them a tied lm_head);
        an untied lm_head is a real matmul and stays counted.
        """
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel()
            if self.pos == "learned":
                n -= self.pos_emb.weight.numel()
        return n

    def _inactive_expert_params(self) -> int:
        """Parameters of the experts a token does not visit (n_experts - top_k per layer)."""
        if self.n_experts == 0:
            return 0
        per_expert = sum(p.numel() for p in self.blocks[0].mlp.experts[0].parameters())
        return self.n_layer * (self.n_experts - self.top_k) * per_expert

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token: 6*N + 12*L*H*Q*T (PaLM appendix B / nanoGPT).

        N is the non-embedding parameter count a token actually touches, so for MoE only
        top_k of the n_experts experts count. The second term is attention's QK^T and AV.
        """
        T = self.seq_len if seq_len is None else seq_len
        n_active = self.num_params(non_embedding=True) - self._inactive_expert_params()
        head_dim = self.d_model // self.n_head
        return float(6 * n_active + 12 * self.n_layer * self.n_head * head_dim * T)
