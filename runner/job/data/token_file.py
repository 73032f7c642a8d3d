"""TokenFile: a flat binary token file, uint16 (nanoGPT's prepare.py) or uint32 (vocabularies
above 65,535, e.g. Llama 3's 128k)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hyprun.runner.job.data.sequences import WindowSource

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
SNIFF_TOKENS = 1 << 16  # tokens read to tell uint32 ids read as uint16 from real uint16 ids


class TokenFile(WindowSource):
    """Windows of a memmapped token file; held-out = heldout_path or the file's tail.

    The file is never read whole: it is memmapped once per process, and only a sample of
    it is scanned at construction to catch token ids >= vocab_size and a uint32 file read as
    uint16 (its high halves: every other token 0).
    """

    label = "token file"

    def __init__(
        self,
        path: str | Path,
        seq_len: int,
        vocab_size: int = 50304,
        heldout_path: str | Path | None = None,
        heldout_frac: float = 0.05,
        dtype: str = "uint16",
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(
                f"data.source.dtype={dtype} is not a token file type: use uint16 or uint32"
            )
        if dtype == "uint16" and int(vocab_size) > 1 << 16:
            raise ValueError(
                f"vocab_size {vocab_size} does not fit uint16 token ids: set "
                "data.source.dtype=uint32 (and write the file as uint32)"
            )
        self.dtype = DTYPES[dtype]
        self.hint = f"{dtype} token file (.bin, flat {dtype} ids)"
        super().__init__(path, seq_len, vocab_size, heldout_path, heldout_frac)
        if dtype == "uint16":
            self._check_not_wider(self._open()[0])

    def _check_not_wider(self, tokens: np.ndarray) -> None:
        sample = np.asarray(tokens[:SNIFF_TOKENS])
        if len(sample) < 64:
            return
        high, low = sample[1::2], sample[0::2]
        if (high == 0).mean() > 0.9 and (low == 0).mean() < 0.1:
            raise ValueError(
                f"{self.label} '{self.path}' looks like uint32 ids read as uint16 (every other "
                "token is 0): set data.source.dtype=uint32"
            )
