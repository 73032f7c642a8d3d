"""The callbacks tell the probe how many optimizer steps one pass over the training data takes
(the fair-stream invariant judges the first epoch only): from the loader's length and the
accumulation, or nothing when the loader has no length."""

from __future__ import annotations

import torch

from hyprun.runner.job.callbacks import _epoch_steps


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from range(8)


def test_an_epoch_is_the_loaders_batches_over_the_accumulation():
    loader = torch.utils.data.DataLoader(range(64), batch_size=4)  # 16 batches
    assert _epoch_steps(loader, 1) == 16
    assert _epoch_steps(loader, 4) == 4
    assert _epoch_steps(loader, 32) == 1  # a step still takes what one epoch has


def test_a_loader_without_a_length_gives_no_epoch():
    assert _epoch_steps(torch.utils.data.DataLoader(Stream(), batch_size=2), 1) is None
    assert _epoch_steps(None, 1) is None
