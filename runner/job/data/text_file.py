"""TextFile: any local text file as byte-level tokens (vocab 256), no tokenizer needed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hyprun.runner.job.data.sequences import WindowSource


class TextFile(WindowSource):
    """Byte windows of a text file (UTF-8 or anything else); held-out = the file's tail."""

    dtype = np.uint8
    label = "text file"
    hint = "text file"

    def __init__(self, path: str | Path, seq_len: int, heldout_frac: float = 0.05) -> None:
        super().__init__(path, seq_len, vocab_size=256, heldout_frac=heldout_frac)
