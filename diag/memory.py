"""Per-GPU memory before the first step: model states by the ZeRO paper, activations by formula.

Model states follow Rajbhandari et al. 2020 (ZeRO), section 3.1: mixed-precision Adam keeps
2 B (16-bit params) + 2 B (16-bit grads) + 12 B (fp32 master, m, v) per parameter; fp32 Adam
keeps 4 + 4 + 8. ZeRO stage 1 shards the optimizer states over the data-parallel world, stage 2
also the gradients, stage 3 also the parameters. The byte counts live in tables/static.yaml.

Activations follow Korthikanti et al. 2022 ("Reducing activation recomputation"), section 4.1:
per layer and sequence s*h*(34 + 5*a*s/h) bytes in 16-bit with dropout and an unfused softmax.
The formula is written out by tensor so it adapts to the built-in GPT: fp32 elements, SwiGLU,
MoE top-k, no dropout masks when dropout is 0, fused attention (no s*s matrices), activation
checkpointing, and the logits, which at a 50k vocabulary rival a layer.

GB here is 10**9 bytes, the unit of the classic tables and of device names ("A100-40GB").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hyprun.diag.rules import static_table

GB = 1e9


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU memory in GB (10**9 bytes), before allocator fragmentation and CUDA context."""

    params_gb: float
    """Model weights held by this GPU (16-bit copy in mixed precision)."""
    grads_gb: float
    """Gradients held by this GPU."""
    optimizer_gb: float
    """Optimizer states held by this GPU: fp32 master weights (mixed precision) plus m and v."""
    activations_gb: float
    """Tensors saved for backward during one micro-batch's forward pass."""
    total_gb: float
    """The sum: what must fit in the device's memory."""


def state_bytes_per_param(precision: str, optimizer: str = "adam") -> dict[str, float]:
    """Bytes per parameter of weights, grads and optimizer states before sharding."""
    memory = static_table()["memory"]
    weights = memory["bytes_per_param"][precision]
    return {
        "params": weights["params"],
        "grads": weights["grads"],
        "optimizer": weights["master"] + memory["optimizer_state_bytes"][optimizer],
    }


def estimate_memory(
    n_params: int,
    zero_stage: int,
    world: int,
    precision: str,
    activations_bytes: float,
    optimizer: str = "adam",
) -> MemoryEstimate:
    """Per-GPU memory of training `n_params` with ZeRO `zero_stage` over `world` data-parallel GPUs.

    `optimizer` is a key of memory.optimizer_state_bytes in the table (adam: m and v, 8 B;
    sgd_momentum: 4 B; sgd: 0 B).
    """
    per_param = state_bytes_per_param(precision, optimizer)
    sharded = static_table()["memory"]["zero_shards"][int(zero_stage)]  # which states are split
    gb = {
        kind: n_params * nbytes / (world if kind in sharded else 1) / GB
        for kind, nbytes in per_param.items()
    }
    activations_gb = activations_bytes / GB
    return MemoryEstimate(
        params_gb=gb["params"],
        grads_gb=gb["grads"],
        optimizer_gb=gb["optimizer"],
        activations_gb=activations_gb,
        total_gb=sum(gb.values()) + activations_gb,
    )


def default_d_ff(d_model: int, mlp: str) -> int:
    """The built-in GPT's MLP width when d_ff is null: 4d for GELU, 8d/3 rounded up for SwiGLU."""
    if mlp != "swiglu":
        return 4 * d_model
    multiple = 64 if d_model >= 192 else 8
    raw = -(-8 * d_model // 3)  # ceil(8/3 * d_model)
    return -(-raw // multiple) * multiple


def _shape(model: dict) -> dict[str, Any]:
    """The built-in GPT's dimensions from its config, defaults filled in."""
    d = int(model["d_model"])
    mlp = model.get("mlp", "gelu")
    experts = int(model.get("n_experts") or 0)
    return {
        "L": int(model["n_layer"]),
        "d": d,
        "a": int(model["n_head"]),
        "s": int(model["seq_len"]),
        "V": int(model["vocab_size"]),
        "ff": int(model.get("d_ff") or default_d_ff(d, mlp)),
        "mlp": mlp,
        "experts": experts,
        "top_k": int(model.get("top_k") or 1) if experts else 1,  # MLPs a token passes through
        "bias": bool(model.get("bias", False)),
    }


def count_params(model: dict, non_embedding: bool = False, active: bool = False) -> int:
    """Parameters of the built-in GPT from its config, tied weights counted once.

    Mirrors hyprun.runner.job.models.GPT.num_params without building the model, so a 1B config
    can be checked on a laptop. `non_embedding` drops the token and position tables; `active` counts
    only the top_k experts a token passes through (what its FLOPs touch).
    """
    m = _shape(model)
    d, ff, bias = m["d"], m["ff"], m["bias"]
    matrices = 3 if m["mlp"] == "swiglu" else 2  # fc, (gate,) proj
    mlp = matrices * d * ff + ((matrices - 1) * ff + d if bias else 0)
    if m["experts"]:
        experts = m["top_k"] if active else m["experts"]
        mlp = experts * mlp + d * m["experts"]  # the experts plus the router
    attention = 4 * d * d + (4 * d if bias else 0)  # qkv and proj
    norm = 2 * d if bias and model.get("norm", "layernorm") == "layernorm" else d
    block = attention + mlp + 2 * norm
    final_norm = norm if model.get("placement", "pre") == "pre" else 0
    tok_emb = m["V"] * d
    pos_emb = m["s"] * d if model.get("pos", "learned") == "learned" else 0
    lm_head = 0 if model.get("tied_embeddings", True) else m["V"] * d
    total = tok_emb + pos_emb + m["L"] * block + final_norm + lm_head
    return total - tok_emb - pos_emb if non_embedding else total


def activation_bytes(
    model: dict, micro_batch: int, precision: str, fused_attention: bool = True
) -> float:
    """Bytes saved for backward by one micro-batch of the built-in GPT (one GPU, no TP/PP).

    Per layer, in elements of s*b*h unless noted (Korthikanti et al. 2022, table 2):
    attention keeps its input, Q, K, V and the context (5); the two norms keep their inputs (2);
    a GELU MLP keeps its input, the pre- and post-activation (1 + 2*ff/h), SwiGLU four ff-wide
    tensors (1 + 4*ff/h), times top_k for MoE. Dropout adds 1-byte masks (2 per layer, plus
    a*s*s for the attention probabilities). An unfused softmax keeps a*s*s scores and
    probabilities; fused SDPA keeps only a row log-sum-exp (4 bytes * a*s). With activation
    checkpointing only each layer's input is kept, plus one layer recomputed during backward.
    Logits: the vocab projection, its fp32 copy for the loss, and the fp32 log-softmax.
    """
    m = _shape(model)
    s, b, h, a, V = m["s"], int(micro_batch), m["d"], m["a"], m["V"]
    e = static_table()["memory"]["bytes_per_param"][precision]["params"]  # bytes per element
    mask = 1 if float(model.get("dropout") or 0.0) > 0 else 0
    mlp_width = (4 if m["mlp"] == "swiglu" else 2) * m["ff"] * m["top_k"] / h
    per_token = e * (5 + 2 + 1 + mlp_width) + 2 * mask  # bytes per (token, hidden unit)
    # Fused SDPA keeps an fp32 log-sum-exp per query row; unfused, scores and probabilities.
    softmax = 4 * a * s * b if fused_attention else (2 * e + mask) * a * s * s * b
    layer = s * b * h * per_token + softmax
    if model.get("activation_checkpointing"):
        layers = m["L"] * e * s * b * h + layer  # inputs of every layer + one recomputed layer
    else:
        layers = m["L"] * layer
    embedding = e * s * b * h  # the block stack's input
    logits = s * b * V * (e + (4 if e != 4 else 0) + 4)
    return layers + embedding + logits
