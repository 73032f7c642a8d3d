"""HFDataset: a tokenized Hugging Face `datasets` dataset saved on disk (`save_to_disk`), read
with `load_from_disk`. Its token-id lists (column `input_ids`) are one stream, as nanoGPT's
prepare.py concatenates documents; windows are cut from it like from a token file.

`datasets` is not a dependency of hyprun: it is imported when such a source is built.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hyprun.runner.compose import one_line
from hyprun.runner.job.data.sequences import WindowSource

HELDOUT_SPLITS = ("validation", "test")
"""Splits of a DatasetDict that hold the held-out set, first found wins (else the tail)."""


class HFDataset(WindowSource):
    """Windows of a saved dataset's concatenated token ids; held-out = its validation (or test)
    split when it has one, else the last `heldout_frac` of the stream."""

    label = "dataset"
    hint = "dataset saved with save_to_disk, with a column of token-id lists"

    def __init__(
        self,
        path: str | Path,
        seq_len: int,
        vocab_size: int = 50304,
        column: str = "input_ids",
        split: str = "train",
        heldout_frac: float = 0.05,
    ) -> None:
        self.column, self.split = column, split
        super().__init__(path, seq_len, vocab_size, None, heldout_frac)

    def _open(self) -> tuple[np.ndarray, np.ndarray]:
        if self._parts is None:
            data = self._load()
            heldout = None
            if hasattr(data, "keys"):  # a DatasetDict
                if self.split not in data:
                    raise ValueError(
                        f"{self.label} '{self.path}' has no split {self.split!r} (splits: "
                        f"{', '.join(data)}): set data.source.split"
                    )
                found = next((s for s in HELDOUT_SPLITS if s in data), None)
                if found is not None:
                    heldout = self._tokens(data[found])
                    self.heldout_path = f"{self.path} [{found}]"
                data = data[self.split]
            tokens = self._tokens(data)
            if heldout is None:
                n_heldout = int(len(tokens) * self.heldout_frac)
                heldout = tokens[len(tokens) - n_heldout :]
                tokens = tokens[: len(tokens) - n_heldout]
            self._parts = (tokens, heldout)
        return self._parts

    def _load(self):
        try:
            from datasets import load_from_disk
        except ImportError:
            raise ValueError(
                "data.source HFDataset needs the datasets package: pip install datasets"
            ) from None
        if not Path(self.path).exists():
            raise ValueError(
                f"{self.label} '{self.path}' not found: set data.source.path to a {self.hint}"
            )
        try:
            return load_from_disk(self.path)
        except Exception as error:  # datasets raises FileNotFoundError or its own errors
            raise ValueError(
                f"{self.label} '{self.path}' cannot be loaded ({one_line(error)[:120]}): "
                f"data.source.path must point to a {self.hint}"
            ) from None

    def _tokens(self, dataset) -> np.ndarray:
        """The column's token-id lists, concatenated (Arrow's flatten: no per-row Python)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.column not in dataset.column_names:
            raise ValueError(
                f"{self.label} '{self.path}' has no column {self.column!r} (columns: "
                f"{', '.join(dataset.column_names)}): set data.source.column, or tokenize first"
            )
        values = dataset.with_format("arrow")[:][self.column]
        kind = values.type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(
            kind.value_type
        ):
            raise ValueError(
                f"{self.label} '{self.path}' column {self.column!r} holds {kind}, not lists of "
                "integer token ids: tokenize it first (dataset.map with your tokenizer)"
            )
        tokens = pc.list_flatten(values).to_numpy()
        if len(tokens) and int(tokens.min()) < 0:
            raise ValueError(f"{self.label} '{self.path}' holds negative token ids")
        return tokens
