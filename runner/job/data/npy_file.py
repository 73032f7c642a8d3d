"""NpyFile: token ids saved with `numpy.save` (any integer dtype; a 2-D array is read row by
row as one stream)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hyprun.runner.compose import one_line
from hyprun.runner.job.data.sequences import WindowSource


class NpyFile(WindowSource):
    """Windows of a memory-mapped .npy token array; held-out = heldout_path or the tail."""

    label = "npy file"
    hint = ".npy array of integer token ids (numpy.save)"

    def __init__(
        self,
        path: str | Path,
        seq_len: int,
        vocab_size: int = 50304,
        heldout_path: str | Path | None = None,
        heldout_frac: float = 0.05,
    ) -> None:
        super().__init__(path, seq_len, vocab_size, heldout_path, heldout_frac)

    def _memmap(self, path: str, key: str) -> np.ndarray:
        file = Path(path)
        if not file.is_file():
            raise ValueError(
                f"{self.label} '{path}' not found: set {key} to an existing {self.hint}"
            )
        try:
            tokens = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as error:
            raise ValueError(
                f"{self.label} '{path}' is not a .npy array ({one_line(error)[:120]}): "
                f"{key} must point to a {self.hint}"
            ) from None
        if not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(
                f"{self.label} '{path}' holds {tokens.dtype}, not integer token ids: "
                f"{key} must point to a {self.hint}"
            )
        if tokens.size == 0:
            raise ValueError(
                f"{self.label} '{path}' is empty: set {key} to a non-empty {self.hint}"
            )
        tokens = tokens.reshape(-1)
        if np.issubdtype(tokens.dtype, np.signedinteger) and int(tokens[: 1 << 24].min()) < 0:
            raise ValueError(
                f"{self.label} '{path}' holds negative token ids: {key} must point to a {self.hint}"
            )
        return tokens
