"""Model FLOPs utilisation: the PaLM / nanoGPT accounting, and peaks per device."""

from __future__ import annotations

from pathlib import Path

from hyprun.diag.rules import TABLES, peaks


def transformer_flops_per_token(
    n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int
) -> float:
    """Training FLOPs per token: 6N for the matmuls of forward + backward, plus 12*L*H*Q*T for
    attention scores and values (PaLM, appendix B). N excludes embedding tables."""
    return 6.0 * n_params + 12.0 * n_layer * n_head * head_dim * seq_len


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Achieved model FLOP/s as a fraction of the hardware peak (of all devices together)."""
    return tokens_per_s * flops_per_token / peak_flops


def device_peak(name: str, precision: str, table: Path = TABLES / "hardware.yaml") -> float | None:
    """The dense peak FLOP/s of one device named `name` at `precision`, or None if unknown."""
    for row in peaks(table):
        if row.match.lower() in name.lower():
            return float(getattr(row, precision, row.bf16))
    return None
