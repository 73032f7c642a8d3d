"""TokenFile: a nanoGPT-style uint16 .bin token file (e.g. from nanoGPT's prepare.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runner.job.data.sequences import WindowSource


class TokenFile(WindowSource):
    """Windows of a memmapped uint16 token file; held-out = heldout_path or the file's tail.

    The file is never read whole: it is memmapped once per process, and only a sample of
    it is scanned at construction to catch token ids >= vocab_size.
    """

    dtype = np.uint16
    label = "token file"
    hint = "nanoGPT-style uint16 .bin file"

    def __init__(
        self,
        path: str | Path,
        seq_len: int,
        vocab_size: int = 50304,
        heldout_path: str | Path | None = None,
        heldout_frac: float = 0.05,
    ) -> None:
        super().__init__(path, seq_len, vocab_size, heldout_path, heldout_frac)
