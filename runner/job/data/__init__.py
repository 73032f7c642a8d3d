"""Data sources and the per-rank loader.

hyprun diagnoses training problems with short, reproducible runs, so the data order depends
only on a seed and the synthetic source can plant real pathologies (duplicates, label noise,
padding waste, slow input).

The data-source protocol
------------------------
A source is any object with:

  vocab_size: int
  seq_len: int
  train(start: int, count: int, seed: int) -> (x, y)
      Sequences number start..start+count-1 of an infinite, seed-determined stream of training
      sequences, as LongTensors of shape [count, seq_len]. y is x shifted by one (next-token
      targets); positions to ignore (padding) have y == -100 (IGNORE_INDEX). The same
      (start, count, seed) must give the same tensors in any process or DataLoader worker,
      and train(a, n) concatenated with train(a + n, m) must equal train(a, n + m).
      Sources are pickled into DataLoader workers: keep them cheap to pickle (reopen files
      or look up caches lazily instead of carrying big arrays).
  heldout(count: int) -> (x, y)
      The first `count` sequences of a fixed held-out set, disjoint from the training data
      and independent of the seed.
  describe() -> dict[str, float | int | str]      (optional)
      Facts for the run log, e.g. corpus tokens or duplicate fraction.

Constructors take plain keyword arguments, so Hydra can build any source, including your own:

  data:
    _target_: hyprun.runner.job.data.Synthetic  # or TokenFile|NpyFile|HFDataset|TextFile
    seq_len: 64                          # or my_package.MySource

Missing or invalid input raises ValueError with a one-line message naming the problem and the
fix. build_loader() turns a source into this rank's micro-batches for a range of steps;
heldout_batches() splits the held-out set across ranks.
"""

from hyprun.runner.job.data.hf_dataset import HFDataset
from hyprun.runner.job.data.loader import build_loader, heldout_batches
from hyprun.runner.job.data.npy_file import NpyFile
from hyprun.runner.job.data.sequences import IGNORE_INDEX, DataSource
from hyprun.runner.job.data.synthetic import Synthetic
from hyprun.runner.job.data.text_file import TextFile
from hyprun.runner.job.data.token_file import TokenFile

__all__ = [
    "IGNORE_INDEX",
    "DataSource",
    "HFDataset",
    "NpyFile",
    "Synthetic",
    "TextFile",
    "TokenFile",
    "build_loader",
    "heldout_batches",
]
