"""Micro-batches for one rank, as a pure function of (seed, step, micro, rank).

Global batch G = micro_batch * grad_accum * world. Global step k consumes stream sequences
[k*G, (k+1)*G); rank r's micro-batch m of that step is the micro_batch sequences starting at
k*G + (m*world + r)*micro_batch. Each micro-batch is one map-style Dataset item, so the batches
are identical for any num_workers, and resuming at start_step yields exactly the batches an
uninterrupted run sees from that step on.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from hyprun.runner.job.data.sequences import IGNORE_INDEX, DataSource

Batch = tuple[torch.Tensor, torch.Tensor]


def trim_padding_columns(x: torch.Tensor, y: torch.Tensor) -> Batch:
    """Drop trailing columns where every target is padding (a causal model never needs them)."""
    real_columns = (y != IGNORE_INDEX).any(dim=0).nonzero()
    keep = int(real_columns[-1]) + 1 if len(real_columns) else 1
    return x[:, :keep].contiguous(), y[:, :keep].contiguous()


class StepSampler(Sampler[tuple[int, int]]):
    """Yields (step, micro) for steps start_step..total_steps-1, grad_accum micros each."""

    def __init__(self, start_step: int, total_steps: int, grad_accum: int) -> None:
        self.start_step, self.total_steps, self.grad_accum = start_step, total_steps, grad_accum

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for step in range(self.start_step, self.total_steps):
            for micro in range(self.grad_accum):
                yield step, micro

    def __len__(self) -> int:
        return (self.total_steps - self.start_step) * self.grad_accum


class MicroBatches(Dataset):
    """Map-style dataset: (step, micro) -> this rank's micro-batch from the source's stream."""

    def __init__(
        self,
        source: DataSource,
        seed: int,
        micro_batch: int,
        grad_accum: int,
        rank: int,
        world: int,
        trim_padding: bool = False,
    ) -> None:
        self.source, self.seed = source, seed
        self.micro_batch, self.grad_accum = micro_batch, grad_accum
        self.rank, self.world = rank, world
        self.trim_padding = trim_padding

    def first_sequence(self, step: int, micro: int) -> int:
        global_batch = self.micro_batch * self.grad_accum * self.world
        return step * global_batch + (micro * self.world + self.rank) * self.micro_batch

    def __getitem__(self, key: tuple[int, int]) -> Batch:
        x, y = self.source.train(self.first_sequence(*key), self.micro_batch, self.seed)
        return trim_padding_columns(x, y) if self.trim_padding else (x, y)


def _check_layout(micro_batch: int, grad_accum: int, rank: int, world: int) -> None:
    if micro_batch < 1 or grad_accum < 1 or world < 1:
        raise ValueError(
            f"micro_batch={micro_batch}, grad_accum={grad_accum}, world={world} must all be >= 1"
        )
    if not 0 <= rank < world:
        raise ValueError(f"rank={rank} must be in [0, world={world}): check the launcher's RANK")


def build_loader(
    source: DataSource,
    *,
    seed: int,
    micro_batch: int,
    grad_accum: int,
    rank: int,
    world: int,
    start_step: int,
    total_steps: int,
    num_workers: int = 0,
    prefetch_factor: int | None = None,
    pin_memory: bool = False,
    trim_padding: bool = False,
) -> DataLoader:
    """This rank's (x, y) micro-batches for steps start_step..total_steps-1, in order."""
    _check_layout(micro_batch, grad_accum, rank, world)
    if not 0 <= start_step <= total_steps:
        raise ValueError(
            f"start_step={start_step} must be in [0, total_steps={total_steps}]: "
            "check the resumed checkpoint's step and the configured number of steps"
        )
    if num_workers < 0:
        raise ValueError(f"num_workers={num_workers} must be >= 0: set data.num_workers")
    dataset = MicroBatches(source, seed, micro_batch, grad_accum, rank, world, trim_padding)
    extra = {"prefetch_factor": prefetch_factor} if num_workers > 0 and prefetch_factor else {}
    return DataLoader(
        dataset,
        batch_size=None,
        sampler=StepSampler(start_step, total_steps, grad_accum),
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=False,
        **extra,
    )


def heldout_batches(
    source: DataSource, count: int, micro_batch: int, rank: int, world: int
) -> list[Batch]:
    """This rank's share of the first `count` held-out sequences: micro-batches r, r+world, ...

    The last micro-batch may be short and ranks may get unequal numbers of batches, so sum
    losses and token counts per rank and all-reduce them rather than averaging batch means.
    """
    _check_layout(micro_batch, 1, rank, world)
    x, y = source.heldout(count)
    starts = range(0, count, micro_batch)
    batches = [(x[s : s + micro_batch], y[s : s + micro_batch]) for s in starts]
    return batches[rank::world]
