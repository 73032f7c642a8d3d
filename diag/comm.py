"""Gradient all-reduce time per optimizer step, from bytes and link bandwidth alone.

A ring all-reduce over `world` ranks sends and receives 2*(w-1)/w times the buffer per rank
(a reduce-scatter then an all-gather, each (w-1)/w), whatever the ring size; so its time is
bounded below by that volume over the per-rank link bandwidth. ZeRO-1/2 replace it by a
reduce-scatter of gradients plus an all-gather of updated weights (the same volume), ZeRO-3
adds a second all-gather of weights in backward: 1.5x (Rajbhandari et al. 2020, section 7).
This ignores latency and overlap with compute: it is the floor a measured step time is set
against, not a prediction of it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AllReduceEstimate:
    """Traffic and time of one step's gradient synchronisation on one rank."""

    grad_bytes: float
    """Size of the gradient buffer being reduced (parameters x bytes per gradient element)."""
    bytes_on_wire: float
    """Bytes each rank sends (and receives): 2*(w-1)/w * grad_bytes, times the ZeRO factor."""
    seconds: float
    """bytes_on_wire over the link bandwidth: the bandwidth-bound floor of the all-reduce."""


def ring_allreduce_bytes(nbytes: float, world: int) -> float:
    """Bytes each rank sends in a ring all-reduce of an `nbytes` buffer over `world` ranks."""
    if world < 1:
        raise ValueError(f"world={world} must be >= 1")
    return 2.0 * (world - 1) / world * nbytes


def allreduce_estimate(
    grad_bytes: float, world: int, link_gbps: float, volume_factor: float = 1.0
) -> AllReduceEstimate:
    """Seconds per step to all-reduce `grad_bytes` over `world` ranks at `link_gbps` Gbit/s.

    `volume_factor` scales the traffic for ZeRO-3's extra all-gather (1.5; else 1.0).
    """
    if link_gbps <= 0:
        raise ValueError(f"link_gbps={link_gbps} must be > 0")
    on_wire = ring_allreduce_bytes(grad_bytes, world) * volume_factor
    return AllReduceEstimate(grad_bytes, on_wire, on_wire * 8 / (link_gbps * 1e9))
