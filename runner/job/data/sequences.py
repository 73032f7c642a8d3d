"""Shared pieces of the data sources: the source protocol, seeded stream order, file windows.

Everything here is a pure function of (seed, sequence index), so any process or DataLoader
worker that asks for the same sequences gets the same tensors.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch

IGNORE_INDEX = -100  # target value for padding; F.cross_entropy skips it by default
MIN_TRAIN_WINDOWS = 4  # a file shorter than this many train windows is surely a mistake
SAMPLE_CHUNKS = 256  # vocab check on big files reads this many chunks ...
SAMPLE_CHUNK_TOKENS = 65536  # ... of this many tokens, instead of the whole file
FULL_CHECK_TOKENS = 1 << 24  # files up to this size are checked completely


@runtime_checkable
class DataSource(Protocol):
    """What the loader and trainer need from a data source (hyprun.runner.job.data says more)."""

    vocab_size: int
    seq_len: int

    def train(self, start: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def heldout(self, count: int) -> tuple[torch.Tensor, torch.Tensor]: ...


def check_span(start: int, count: int) -> None:
    """Reject negative stream positions early; they would silently wrap in numpy."""
    if start < 0 or count < 0:
        raise ValueError(f"train(start={start}, count={count}): start and count must be >= 0")


def seed_entropy(seed: int) -> int:
    """numpy seeds must be non-negative; fold any Python int into 64 bits."""
    return int(seed) % (1 << 64)


# ---------------------------------------------------------------- pool order (Synthetic)


@functools.lru_cache(maxsize=64)
def epoch_permutation(pool_size: int, seed: int, epoch: int) -> np.ndarray:
    """Pool order in one epoch; depends only on (seed, epoch), cached because it is reused."""
    rng = np.random.default_rng([seed_entropy(seed), epoch])
    order = rng.permutation(pool_size)
    order.flags.writeable = False  # shared through the cache
    return order


def pool_indices(start: int, count: int, seed: int, pool_size: int) -> np.ndarray:
    """Pool rows for stream positions start..start+count-1 (epoch e = a fresh permutation)."""
    positions = np.arange(start, start + count, dtype=np.int64)
    epochs, offsets = np.divmod(positions, pool_size)
    rows = np.empty(count, dtype=np.int64)
    for epoch in np.unique(epochs):
        here = epochs == epoch
        rows[here] = epoch_permutation(pool_size, seed, int(epoch))[offsets[here]]
    return rows


# ---------------------------------------------------------------- window offsets (files)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a cheap, well-mixed, counter-based hash of uint64 values."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def window_offsets(start: int, count: int, seed: int, n_offsets: int) -> np.ndarray:
    """Window starts for sequences start..start+count-1; sequence i depends on (seed, i) only."""
    index = np.arange(start, start + count, dtype=np.uint64)
    key = splitmix64(np.array([seed_entropy(seed)], dtype=np.uint64))
    with np.errstate(over="ignore"):
        hashed = splitmix64(key + (index + np.uint64(1)) * _GOLDEN)
    return (hashed % np.uint64(n_offsets)).astype(np.int64)


def max_token_sample(tokens: np.ndarray) -> int:
    """Largest token in the file (or in evenly spaced chunks of it, for big files)."""
    if len(tokens) <= FULL_CHECK_TOKENS:
        return int(tokens.max())
    starts = np.linspace(0, len(tokens) - SAMPLE_CHUNK_TOKENS, SAMPLE_CHUNKS).astype(np.int64)
    return max(int(tokens[s : s + SAMPLE_CHUNK_TOKENS].max()) for s in starts)


class WindowSource:
    """Train/held-out windows of seq_len+1 tokens cut from one memmapped token file.

    Training sequence i starts at a hashed (seed, i) offset inside the train part; held-out
    sequences are consecutive non-overlapping windows of the held-out part (the heldout_path
    file, else the last heldout_frac of the main file), so the two never share a token position.
    Subclasses set how the file is read (dtype) and how it is named in error messages.
    """

    dtype: type = np.uint16
    label = "token file"
    hint = "nanoGPT-style uint16 .bin file"

    def __init__(
        self,
        path: str | Path,
        seq_len: int,
        vocab_size: int,
        heldout_path: str | Path | None = None,
        heldout_frac: float = 0.05,
    ) -> None:
        if int(seq_len) < 1:
            raise ValueError(f"seq_len={seq_len} must be >= 1: set model.seq_len")
        if int(vocab_size) < 1:
            raise ValueError(f"vocab_size={vocab_size} must be >= 1: set data.vocab_size")
        if heldout_path is None and not 0.0 < float(heldout_frac) < 1.0:
            raise ValueError(
                f"heldout_frac={heldout_frac} must be in (0, 1): "
                "set data.source.heldout_frac, e.g. 0.05"
            )
        self.path = str(path)
        self.heldout_path = None if heldout_path is None else str(heldout_path)
        self.seq_len = int(seq_len)
        self.vocab_size = int(vocab_size)
        self.heldout_frac = float(heldout_frac)
        self._parts: tuple[np.ndarray, np.ndarray] | None = None
        train_part, heldout_part = self._open()
        self._check_lengths(len(train_part), len(heldout_part))
        for name, part in ((self.path, train_part), (self.heldout_path or self.path, heldout_part)):
            self._check_vocab(name, max_token_sample(part))

    # -- file handling

    def __getstate__(self) -> dict:
        """Pickle (e.g. to DataLoader workers) without the memmap; each process reopens the file."""
        state = dict(self.__dict__)
        state["_parts"] = None
        return state

    def _memmap(self, path: str, key: str) -> np.ndarray:
        file = Path(path)
        if not file.is_file():
            raise ValueError(
                f"{self.label} '{path}' not found: set {key} to an existing {self.hint}"
            )
        size = file.stat().st_size
        itemsize = np.dtype(self.dtype).itemsize
        if size % itemsize:
            raise ValueError(
                f"{self.label} '{path}' has {size} bytes, not a multiple of {itemsize}: "
                f"{key} must point to a {self.hint}"
            )
        if size == 0:
            raise ValueError(
                f"{self.label} '{path}' is empty: set {key} to a non-empty {self.hint}"
            )
        return np.memmap(file, dtype=self.dtype, mode="r")

    def _open(self) -> tuple[np.ndarray, np.ndarray]:
        """(train tokens, held-out tokens), opened lazily once per process."""
        if self._parts is None:
            tokens = self._memmap(self.path, "data.source.path")
            if self.heldout_path is not None:
                self._parts = (tokens, self._memmap(self.heldout_path, "data.source.heldout_path"))
            else:
                n_heldout = int(len(tokens) * self.heldout_frac)
                self._parts = (tokens[: len(tokens) - n_heldout], tokens[len(tokens) - n_heldout :])
        return self._parts

    def _check_lengths(self, n_train: int, n_heldout: int) -> None:
        window = self.seq_len + 1
        need_train, need_heldout = MIN_TRAIN_WINDOWS * window, window
        if self.heldout_path is not None:
            if n_train < need_train:
                self._too_short(self.path, n_train, need_train)
            if n_heldout < need_heldout:
                self._too_short(self.heldout_path, n_heldout, need_heldout)
        elif n_train < need_train or n_heldout < need_heldout:
            frac = self.heldout_frac
            need = max(math.ceil(need_heldout / frac), math.ceil(need_train / (1 - frac))) + 1
            self._too_short(self.path, n_train + n_heldout, need)

    def _too_short(self, path: str, n_tokens: int, need: int) -> None:
        raise ValueError(
            f"{self.label} '{path}' has {n_tokens} tokens, too few for seq_len={self.seq_len} "
            f"(needs >= {need}): use a longer file or a smaller model.seq_len"
        )

    def _check_vocab(self, path: str, max_token: int) -> None:
        if max_token >= self.vocab_size:
            raise ValueError(
                f"{self.label} '{path}' holds token {max_token} >= vocab_size {self.vocab_size}: "
                f"set data.vocab_size above the largest token id, or check it is a {self.hint}"
            )

    # -- the source protocol

    def _windows(
        self, tokens: np.ndarray, starts: np.ndarray, path: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y for windows of seq_len+1 tokens starting at `starts`."""
        window = starts[:, None] + np.arange(self.seq_len + 1, dtype=np.int64)
        chunk = torch.from_numpy(np.asarray(tokens[window], dtype=np.int64))
        if chunk.numel() and int(chunk.max()) >= self.vocab_size:  # the sample check can miss
            self._check_vocab(path, int(chunk.max()))
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()

    def train(self, start: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Stream sequences start..start+count-1: windows at (seed, index)-hashed offsets."""
        check_span(start, count)
        tokens = self._open()[0]
        starts = window_offsets(start, count, seed, len(tokens) - self.seq_len)
        return self._windows(tokens, starts, self.path)

    def heldout(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `count` consecutive non-overlapping windows of the held-out part."""
        tokens = self._open()[1]
        window = self.seq_len + 1
        available = len(tokens) // window
        if not 0 <= count <= available:
            raise ValueError(
                f"held-out part of {self.label} '{self.heldout_path or self.path}' has "
                f"{available} windows of {window} tokens, {count} requested: "
                "ask for fewer held-out sequences or give more held-out data"
            )
        starts = np.arange(count, dtype=np.int64) * window
        return self._windows(tokens, starts, self.heldout_path or self.path)

    def describe(self) -> dict[str, float | int | str]:
        """File facts for the run log."""
        train_part, heldout_part = self._open()
        return {
            "source": type(self).__name__,
            "path": self.path,
            "heldout_path": self.heldout_path or "",
            "vocab_size": self.vocab_size,
            "seq_len": self.seq_len,
            "train_tokens": len(train_part),
            "heldout_tokens": len(heldout_part),
            "heldout_windows": len(heldout_part) // (self.seq_len + 1),
        }
