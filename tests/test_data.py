"""Tests for hyprun.runner.job.data: stream determinism, loader layout, synthetic language,
its knobs."""

from __future__ import annotations

import math
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hyprun.runner.job.data import (
    IGNORE_INDEX,
    Synthetic,
    TextFile,
    TokenFile,
    build_loader,
    heldout_batches,
)
from hyprun.runner.job.data.synthetic import build_pools

SMALL = dict(vocab_size=64, seq_len=32, n_train=512, n_heldout=64)


def rows(x: torch.Tensor) -> set[bytes]:
    return {bytes(r.numpy().tobytes()) for r in x}


def write_tokens(path: Path, tokens: np.ndarray) -> Path:
    tokens.astype(np.uint16).tofile(path)
    return path


def split_token_file(tmp_path: Path) -> TokenFile:
    """Train part holds tokens < 100, held-out tail (last 5%) holds tokens >= 100."""
    n, n_held = 4000, 200
    rng = np.random.default_rng(0)
    tokens = np.concatenate([rng.integers(0, 100, n - n_held), rng.integers(100, 120, n_held)])
    return TokenFile(write_tokens(tmp_path / "t.bin", tokens), seq_len=16, vocab_size=128)


def split_text_file(tmp_path: Path) -> TextFile:
    """Train part is lowercase text, held-out tail (last 5%) is digits."""
    rng = np.random.default_rng(0)
    text = "".join(rng.choice(list("abcdefghij "), 3800)) + "".join(rng.choice(list("0123"), 200))
    path = tmp_path / "t.txt"
    path.write_text(text)
    return TextFile(path, seq_len=16)


def make_source(kind: str, tmp_path: Path):
    if kind == "synthetic":
        return Synthetic(**SMALL)
    if kind == "token_file":
        return split_token_file(tmp_path)
    return split_text_file(tmp_path)


KINDS = ["synthetic", "token_file", "text_file"]


# ---------------------------------------------------------------- the source protocol


@pytest.mark.parametrize("kind", KINDS)
def test_train_is_deterministic_and_concatenates(kind, tmp_path):
    source = make_source(kind, tmp_path)
    x, y = source.train(500, 40, seed=7)  # crosses the synthetic epoch boundary at 512
    assert x.shape == y.shape == (40, source.seq_len) and x.dtype == y.dtype == torch.long
    x2, y2 = source.train(500, 40, seed=7)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    xa, ya = source.train(500, 15, seed=7)
    xb, yb = source.train(515, 25, seed=7)
    assert torch.equal(torch.cat([xa, xb]), x) and torch.equal(torch.cat([ya, yb]), y)
    real = y[:, :-1] != IGNORE_INDEX
    assert torch.equal(y[:, :-1][real], x[:, 1:][real])  # y is x shifted by one


@pytest.mark.parametrize("kind", KINDS)
def test_seeds_change_order_not_heldout(kind, tmp_path):
    source = make_source(kind, tmp_path)
    assert not torch.equal(source.train(0, 32, seed=1)[0], source.train(0, 32, seed=2)[0])
    source_again = make_source(kind, tmp_path)
    assert torch.equal(source.heldout(8)[0], source_again.heldout(8)[0])
    assert torch.equal(source.heldout(8)[1], source_again.heldout(8)[1])


def test_synthetic_epoch_is_a_permutation_and_heldout_is_disjoint():
    source = Synthetic(**SMALL)
    pool_a, pool_b = source.train(0, 512, seed=1)[0], source.train(0, 512, seed=2)[0]
    assert sorted(map(bytes, pool_a.numpy())) == sorted(map(bytes, pool_b.numpy()))
    assert not rows(source.heldout(64)[0]) & rows(pool_a)


def test_synthetic_heldout_drops_train_sequences():
    """A tiny language repeats itself, so held-out rows really collide with train rows."""
    source = Synthetic(vocab_size=8, seq_len=4, n_train=32, n_heldout=16, branching=2)
    assert len(rows(source.train(0, 32, seed=0)[0])) < 32  # natural repeats exist
    assert not rows(source.heldout(16)[0]) & rows(source.train(0, 32, seed=0)[0])


@pytest.mark.parametrize("kind", ["token_file", "text_file"])
def test_file_heldout_is_disjoint_from_train(kind, tmp_path):
    source = make_source(kind, tmp_path)
    tail = torch.arange(100, 120) if kind == "token_file" else torch.tensor(list(b"0123"))
    x, y = source.train(0, 2000, seed=3)
    assert not torch.isin(torch.cat([x, y]), tail).any()  # train windows never reach the tail
    hx, hy = source.heldout(source.describe()["heldout_windows"])
    assert len(hx) == 200 // 17 and torch.isin(torch.cat([hx, hy]), tail).all()
    with pytest.raises(ValueError, match="held-out"):
        source.heldout(10_000)


def test_token_file_heldout_path(tmp_path):
    train = write_tokens(tmp_path / "train.bin", np.arange(1000) % 50)
    held = write_tokens(tmp_path / "val.bin", 50 + np.arange(100) % 10)
    source = TokenFile(train, seq_len=8, vocab_size=64, heldout_path=held)
    assert int(source.train(0, 100, seed=0)[0].max()) < 50
    hx, hy = source.heldout(11)
    assert torch.equal(hx[0], torch.arange(50, 58)) and torch.equal(hy[0], torch.arange(51, 59))


def test_sources_pickle_small(tmp_path):
    """DataLoader workers receive pickled sources; they must not carry the data with them."""
    big = write_tokens(tmp_path / "big.bin", np.arange(200_000) % 1000)
    token_file = TokenFile(big, seq_len=32, vocab_size=1024)
    for source in (token_file, Synthetic()):
        copy = pickle.loads(pickle.dumps(source))
        assert len(pickle.dumps(source)) < 10_000
        assert torch.equal(copy.train(3, 4, seed=5)[0], source.train(3, 4, seed=5)[0])


def test_hydra_instantiates_sources():
    hydra_utils = pytest.importorskip("hydra.utils")
    source = hydra_utils.instantiate({"_target_": "hyprun.runner.job.data.Synthetic", **SMALL})
    assert isinstance(source, Synthetic) and source.seq_len == 32


# ---------------------------------------------------------------- file errors


def one_line_error(make, *needles: str) -> None:
    with pytest.raises(ValueError) as info:
        make()
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_file_errors_are_one_line_and_name_the_file(tmp_path):
    missing = tmp_path / "missing.bin"
    one_line_error(
        lambda: TokenFile(missing, seq_len=8), "missing.bin", "not found", "data.source.path"
    )
    short = write_tokens(tmp_path / "short.bin", np.arange(20))
    one_line_error(lambda: TokenFile(short, seq_len=8), "short.bin", "too few")
    bad = write_tokens(tmp_path / "bad.bin", np.full(4000, 7))
    one_line_error(lambda: TokenFile(bad, seq_len=8, vocab_size=5), "bad.bin", "vocab_size")
    held = write_tokens(tmp_path / "held.bin", np.arange(3))
    good = write_tokens(tmp_path / "good.bin", np.arange(4000) % 7)
    one_line_error(lambda: TokenFile(good, seq_len=8, heldout_path=held), "held.bin", "too few")
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"abc")
    one_line_error(lambda: TokenFile(odd, seq_len=8), "odd.bin", "uint16")
    one_line_error(lambda: TextFile(tmp_path / "no.txt", seq_len=8), "no.txt", "not found")
    (tmp_path / "tiny.txt").write_text("hello")
    one_line_error(lambda: TextFile(tmp_path / "tiny.txt", seq_len=8), "tiny.txt", "too few")
    one_line_error(lambda: TextFile(good, seq_len=8, heldout_frac=1.5), "heldout_frac")


def test_synthetic_rejects_bad_settings():
    one_line_error(lambda: Synthetic(**SMALL, min_len=99), "min_len")
    one_line_error(lambda: Synthetic(**SMALL, duplicate_frac=1.0), "duplicate_frac")
    one_line_error(lambda: Synthetic(**SMALL, branching=0), "branching")
    one_line_error(lambda: Synthetic(**SMALL).heldout(65), "n_heldout")


# ---------------------------------------------------------------- loader


def loader_batches(source, **kwargs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    settings = dict(seed=3, micro_batch=4, grad_accum=2, rank=0, world=1, start_step=0)
    settings.update(kwargs)
    return list(build_loader(source, total_steps=settings.pop("total_steps", 5), **settings))


def assert_same_batches(a, b) -> None:
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("kind", ["synthetic", "token_file"])
def test_loader_same_for_any_num_workers(kind, tmp_path):
    source = make_source(kind, tmp_path)
    serial = loader_batches(source)
    assert len(serial) == 10
    parallel = loader_batches(source, num_workers=2, prefetch_factor=2)
    assert_same_batches(serial, parallel)


def test_loader_ranks_partition_the_global_batch():
    source = Synthetic(**SMALL)
    single = loader_batches(source, micro_batch=4, grad_accum=2, world=1)
    rank0 = loader_batches(source, micro_batch=2, grad_accum=2, world=2, rank=0)
    rank1 = loader_batches(source, micro_batch=2, grad_accum=2, world=2, rank=1)
    for step in range(5):
        global_x = torch.cat([x for x, _ in single[2 * step : 2 * step + 2]])
        # micro m of rank r starts at (m * world + r) * micro_batch within the step
        parts = [rank0[2 * step], rank1[2 * step], rank0[2 * step + 1], rank1[2 * step + 1]]
        assert torch.equal(torch.cat([x for x, _ in parts]), global_x)
        assert torch.equal(global_x, source.train(step * 8, 8, seed=3)[0])


def test_loader_resume_matches_uninterrupted_run():
    source = Synthetic(**SMALL)
    full = loader_batches(source, total_steps=6)
    resumed = loader_batches(source, start_step=4, total_steps=6)
    assert_same_batches(full[8:], resumed)


def test_loader_trims_padding_columns():
    source = Synthetic(**SMALL, min_len=2)
    plain = loader_batches(source, micro_batch=2, total_steps=20)
    trimmed = loader_batches(source, micro_batch=2, total_steps=20, trim_padding=True)
    widths = [x.shape[1] for x, _ in trimmed]
    assert min(widths) < source.seq_len  # some batches really got shorter
    for (x, y), (tx, ty) in zip(plain, trimmed, strict=True):
        width = tx.shape[1]
        assert torch.equal(tx, x[:, :width]) and torch.equal(ty, y[:, :width])
        assert (ty[:, -1] != IGNORE_INDEX).any() and (y[:, width:] == IGNORE_INDEX).all()


def test_heldout_batches_split_across_ranks():
    source = Synthetic(**SMALL)
    x_all = source.heldout(50)[0]
    per_rank = [heldout_batches(source, 50, micro_batch=8, rank=r, world=3) for r in range(3)]
    assert [len(b) for b in per_rank] == [3, 2, 2]  # 7 micro-batches: r, r+3, ...
    order = [per_rank[i % 3][i // 3][0] for i in range(7)]
    assert torch.equal(torch.cat(order), x_all)


# ---------------------------------------------------------------- synthetic language


def conditional_entropy(x: torch.Tensor, y: torch.Tensor, vocab_size: int) -> float:
    """Empirical H(y_t | x_t) in nats, over real positions."""
    real = y != IGNORE_INDEX
    counts = torch.zeros(vocab_size, vocab_size, dtype=torch.float64)
    counts.index_put_((x[real], y[real]), torch.ones(int(real.sum()), dtype=torch.float64), True)
    p_pair = counts / counts.sum()
    p_next = counts / counts.sum(1, keepdim=True).clamp(min=1)
    return float(-(p_pair[counts > 0] * p_next[counts > 0].log()).sum())


def copy_fraction(x: torch.Tensor) -> float:
    """Rows whose second half repeats the tokens p back, for some p in [half/2, half]."""
    half = (x.shape[1] + 1) // 2
    found = torch.zeros(len(x), dtype=torch.bool)
    for period in range((half + 1) // 2, half + 1):
        found |= (x[:, half:] == x[:, half - period : x.shape[1] - period]).all(1)
    return float(found.float().mean())


def test_default_synthetic_is_fast_and_learnable():
    build_pools.cache_clear()
    began = time.perf_counter()
    source = Synthetic()
    assert time.perf_counter() - began < 1.0
    x, y = source.train(0, source.n_train, seed=0)
    entropy = conditional_entropy(x, y, source.vocab_size)
    assert entropy < 0.6 * math.log(source.vocab_size)
    assert abs(source.describe()["bigram_entropy"] - entropy) < 1e-6
    assert abs(copy_fraction(x) - 0.5) < 0.05
    assert copy_fraction(Synthetic(copy_prob=0.0).train(0, 8192, seed=0)[0]) < 0.01


def test_synthetic_pools_are_cached():
    assert Synthetic(**SMALL).pools() is Synthetic(**SMALL, loader_delay_ms=1).pools()


def test_duplicate_frac_lowers_unique_fraction():
    clean = Synthetic(**SMALL).train(0, 512, seed=0)[0]
    duplicated = Synthetic(**SMALL, duplicate_frac=0.4)
    x = duplicated.train(0, 512, seed=0)[0]
    assert len(rows(clean)) == 512
    assert len(rows(x)) / 512 == pytest.approx(0.6, abs=0.01)
    assert duplicated.describe()["unique_frac"] == pytest.approx(0.6, abs=0.01)


def test_label_noise_changes_only_targets():
    clean = Synthetic(**SMALL).train(0, 512, seed=0)
    noisy = Synthetic(**SMALL, label_noise=0.2).train(0, 512, seed=0)
    assert torch.equal(clean[0], noisy[0])  # inputs untouched
    changed = float((clean[1] != noisy[1]).float().mean())
    assert changed == pytest.approx(0.2, abs=0.02)
    x, y = noisy
    assert float((y[:, :-1] != x[:, 1:]).float().mean()) == pytest.approx(0.2, abs=0.02)
    assert torch.equal(Synthetic(**SMALL, label_noise=0.2).train(0, 512, seed=0)[1], y)


def test_min_len_pads_the_expected_fraction():
    source = Synthetic(**SMALL, min_len=8)
    x, y = source.train(0, 512, seed=0)
    padding = y == IGNORE_INDEX
    expected = (32 - 8) / (2 * 32)
    assert float(padding.float().mean()) == pytest.approx(expected, abs=0.03)
    assert (x[padding] == 0).all()
    assert source.describe()["pad_frac"] == pytest.approx(expected, abs=0.03)
    lengths = (~padding).sum(1)
    assert int(lengths.min()) >= 8 and (padding.long().diff(dim=1) >= 0).all()  # tail padding
    assert (Synthetic(**SMALL).train(0, 512, seed=0)[1] != IGNORE_INDEX).all()


def test_loader_delay_slows_train():
    source = Synthetic(**SMALL, loader_delay_ms=50)
    began = time.perf_counter()
    source.train(0, 4, seed=0)
    assert time.perf_counter() - began >= 0.05


def test_near_duplicates_are_planted_and_dedup_removes_exact_and_near_copies():
    from hyprun.diag.dedup import exact_duplicate_ratio, near_duplicate_ratio

    planted = Synthetic(**SMALL, duplicate_frac=0.3, near_duplicate_frac=0.1)
    x, y = (t.numpy() for t in planted.train(0, planted.pool_size, 0))
    real = y != -100
    assert exact_duplicate_ratio(x, mask=real) > 0.2
    assert near_duplicate_ratio(x, mask=real) > 0.07  # one changed token: Jaccard ~0.85
    clean = Synthetic(**SMALL, duplicate_frac=0.3, near_duplicate_frac=0.1, dedup=True)
    assert clean.pool_size < 0.75 * planted.pool_size
    x, y = (t.numpy() for t in clean.train(0, clean.pool_size, 0))
    assert exact_duplicate_ratio(x, mask=y != -100) == 0.0
    assert near_duplicate_ratio(x, mask=y != -100) == 0.0
