"""Synthetic: a generated, learnable toy language with switchable data pathologies.

The language is a sparse first-order Markov chain (each token has `branching` successors with
Zipf-like probabilities 1, 1/2, 1/3, ...) fixed by language_seed. With probability copy_prob a
sequence's second half repeats the tokens p positions back (p in [half/2, half]), i.e. it
copies a span of the first half, so attention (induction) matters and not only bigrams.

A pool of n_train sequences is generated once per parameter set (cached in-process) and the
training stream visits it in seed-drawn epoch permutations. Each pathology knob draws from its
own random stream, so switching one on leaves everything else about the data unchanged:
  duplicate_frac  that fraction of pool rows become exact copies of a few other rows
  near_duplicate_frac  that fraction become copies of other rows with one token changed
  dedup           drop exact and near-duplicate rows from the pool (diag/dedup.py: hashes, and
                  MinHash + LSH at Jaccard >= 0.8 of 5-gram sets), as a dedup pass would
  label_noise     that fraction of targets (y only) become a different, uniform random token
  min_len         real length ~ U[min_len, seq_len]; the rest is padding (x=0, y=-100)
  loader_delay_ms train() sleeps this long per call (an input-bound job)
The held-out pool comes from another stream of the same language, has the same padding but no
label noise or duplicates (it measures the clean task), and shares no x row with the train pool.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from hyprun.diag.dedup import deduplicated
from hyprun.runner.job.data.sequences import IGNORE_INDEX, check_span, pool_indices

# Random streams of one language, as the middle entry of [language_seed, stream, round].
LANGUAGE, TRAIN, LENGTHS, NOISE, DUPLICATES, HELDOUT, NEAR_DUPLICATES = range(7)
COPIES_PER_DUPLICATED_ROW = 16  # duplicate_frac reuses about n_dup / 16 source rows
HELDOUT_ROUNDS = 8  # attempts to find enough held-out rows not in the train pool


@dataclass(frozen=True)
class Pools:
    """Generated train and held-out sequences, int64 numpy arrays of shape [n, seq_len]."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_heldout: np.ndarray
    y_heldout: np.ndarray
    copy_frac: float  # fraction of train rows generated with a copy segment


def stream_rng(language_seed: int, stream: int, round_: int = 0) -> np.random.Generator:
    """A separate random stream per purpose, so one knob never shifts another's draws."""
    return np.random.default_rng([language_seed, stream, round_])


def make_language(
    vocab_size: int, branching: int, language_seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Successor table [vocab, branching] and the shared Zipf CDF over successor ranks."""
    rng = stream_rng(language_seed, LANGUAGE)
    successors = np.stack(
        [rng.choice(vocab_size, branching, replace=False) for _ in range(vocab_size)]
    )
    weights = 1.0 / np.arange(1, branching + 1)
    return successors, np.cumsum(weights) / weights.sum()


def sample_tokens(
    successors: np.ndarray,
    cdf: np.ndarray,
    n: int,
    length: int,
    copy_prob: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """n token rows of `length`, generated position by position for all rows at once."""
    vocab_size, branching = successors.shape
    tokens = np.empty((n, length), dtype=np.int64)
    tokens[:, 0] = rng.integers(0, vocab_size, n)
    ranks = np.minimum(np.searchsorted(cdf, rng.random((n, length)), side="right"), branching - 1)
    copied = rng.random(n) < copy_prob
    half = length // 2
    period = rng.integers((half + 1) // 2, half + 1, n)
    rows = np.arange(n)
    for t in range(1, length):
        following = successors[tokens[:, t - 1], ranks[:, t]]
        if t >= half:
            following = np.where(copied, tokens[rows, t - period], following)
        tokens[:, t] = following
    return tokens, copied


def sample_lengths(
    n: int, seq_len: int, min_len: int | None, rng: np.random.Generator
) -> np.ndarray:
    """Real length of each row: seq_len, or uniform in [min_len, seq_len]."""
    if min_len is None:
        return np.full(n, seq_len)
    return rng.integers(min_len, seq_len + 1, n)


def to_xy(tokens: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Next-token pairs; positions past each row's length become padding (x=0, y=-100)."""
    x, y = tokens[:, :-1].copy(), tokens[:, 1:].copy()
    padding = np.arange(x.shape[1])[None, :] >= lengths[:, None]
    x[padding], y[padding] = 0, IGNORE_INDEX
    return x, y


def add_label_noise(y: np.ndarray, frac: float, vocab_size: int, rng: np.random.Generator) -> None:
    """Replace `frac` of the real targets by a different uniformly random token, in place."""
    if frac <= 0:
        return
    hit = (rng.random(y.shape) < frac) & (y != IGNORE_INDEX)
    shift = rng.integers(1, vocab_size, y.shape)
    y[hit] = (y[hit] + shift[hit]) % vocab_size


def add_duplicates(x: np.ndarray, y: np.ndarray, frac: float, rng: np.random.Generator) -> None:
    """Overwrite `frac` of the rows with copies of a few other rows, in place."""
    n = len(x)
    n_dup = min(round(frac * n), n - 1)
    if n_dup <= 0:
        return
    order = rng.permutation(n)
    n_src = max(1, n_dup // COPIES_PER_DUPLICATED_ROW)
    sources = order[n_dup : n_dup + n_src]
    targets, picks = order[:n_dup], sources[rng.integers(0, len(sources), n_dup)]
    x[targets], y[targets] = x[picks], y[picks]


def add_near_duplicates(
    x: np.ndarray, y: np.ndarray, frac: float, vocab_size: int, rng: np.random.Generator
) -> None:
    """Overwrite `frac` of the rows with copies of other rows that differ in one token, in place.

    The changed token is the last real one (a template with another ending): of its S n-gram
    shingles one differs, a Jaccard of (S-1)/(S+1) (0.97 at 64 tokens and 5-grams), a
    near-duplicate at the usual 0.8 cut at any length. Sources and targets are distinct rows,
    so no near copy is also an exact copy.
    """
    n, width = x.shape
    n_near = min(round(frac * n), n // 2)
    if n_near <= 0 or width < 2:
        return
    order = rng.permutation(n)
    targets, sources = order[:n_near], order[n_near : 2 * n_near]
    x[targets], y[targets] = x[sources], y[sources]
    real = (y[targets] != IGNORE_INDEX).sum(axis=1)
    where = np.maximum(real - 1, 1)  # x[p] is y[p-1]: change both, so the row stays a text
    new = (x[targets, where] + rng.integers(1, vocab_size, n_near)) % vocab_size
    x[targets, where], y[targets, where - 1] = new, new


def row_keys(x: np.ndarray) -> list[bytes]:
    """Hashable bytes per row, for exact-duplicate checks."""
    return [row.tobytes() for row in x]


def sample_heldout(
    language: tuple[np.ndarray, np.ndarray],
    n_heldout: int,
    seq_len: int,
    copy_prob: float,
    min_len: int | None,
    language_seed: int,
    train_x: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """n_heldout fresh sequences whose x rows do not occur in the train pool."""
    seen = set(row_keys(train_x))
    xs, ys, found = [], [], 0
    for round_ in range(HELDOUT_ROUNDS):
        rng = stream_rng(language_seed, HELDOUT, round_)
        n = n_heldout + n_heldout // 4 + 8
        tokens, _ = sample_tokens(*language, n, seq_len + 1, copy_prob, rng)
        x, y = to_xy(tokens, sample_lengths(n, seq_len, min_len, rng))
        keep = np.array([key not in seen for key in row_keys(x)])
        xs.append(x[keep])
        ys.append(y[keep])
        found += int(keep.sum())
        if found >= n_heldout:
            return np.concatenate(xs)[:n_heldout], np.concatenate(ys)[:n_heldout]
    raise ValueError(
        f"only {found} of n_heldout={n_heldout} held-out sequences differ from the train pool: "
        "raise data.vocab_size or model.seq_len, or lower data.source.n_heldout"
    )


@functools.lru_cache(maxsize=16)
def build_pools(
    vocab_size: int,
    seq_len: int,
    n_train: int,
    n_heldout: int,
    language_seed: int,
    branching: int,
    copy_prob: float,
    duplicate_frac: float,
    label_noise: float,
    min_len: int | None,
    near_duplicate_frac: float = 0.0,
    dedup: bool = False,
) -> Pools:
    """Generate (and cache: many jobs share one process) the train and held-out pools."""
    language = make_language(vocab_size, branching, language_seed)
    tokens, copied = sample_tokens(
        *language, n_train, seq_len + 1, copy_prob, stream_rng(language_seed, TRAIN)
    )
    lengths = sample_lengths(n_train, seq_len, min_len, stream_rng(language_seed, LENGTHS))
    x, y = to_xy(tokens, lengths)
    add_label_noise(y, label_noise, vocab_size, stream_rng(language_seed, NOISE))
    add_duplicates(x, y, duplicate_frac, stream_rng(language_seed, DUPLICATES))
    add_near_duplicates(
        x, y, near_duplicate_frac, vocab_size, stream_rng(language_seed, NEAR_DUPLICATES)
    )
    if dedup:
        keep = deduplicated(x, mask=y != IGNORE_INDEX)
        x, y = x[keep], y[keep]
    x_held, y_held = sample_heldout(
        language, n_heldout, seq_len, copy_prob, min_len, language_seed, x
    )
    for array in (x, y, x_held, y_held):
        array.flags.writeable = False  # shared through the cache
    return Pools(x, y, x_held, y_held, float(copied.mean()))


def bigram_entropy(x: np.ndarray, y: np.ndarray) -> float:
    """Empirical H(next | current) in nats over real (non-padding) positions."""
    real = y != IGNORE_INDEX
    current, following = x[real], y[real]
    if current.size == 0:
        return 0.0
    width = int(max(current.max(), following.max())) + 1
    pairs, counts = np.unique(current * width + following, return_counts=True)
    row_totals = np.bincount(pairs // width, weights=counts)
    p_pair = counts / counts.sum()
    return float(-(p_pair * np.log(counts / row_totals[pairs // width])).sum())


def _check_fraction(name: str, value: float, upper_open: bool = False) -> None:
    ok = 0.0 <= value < 1.0 if upper_open else 0.0 <= value <= 1.0
    if not ok:
        bound = "[0, 1)" if upper_open else "[0, 1]"
        raise ValueError(f"{name}={value} must be in {bound}: set data.source.{name}")


class Synthetic:
    """Generated Markov+copy language; see the module docstring for the pathology knobs."""

    def __init__(
        self,
        vocab_size: int = 256,
        seq_len: int = 64,
        n_train: int = 8192,
        n_heldout: int = 512,
        language_seed: int = 1234,
        branching: int = 4,
        copy_prob: float = 0.5,
        duplicate_frac: float = 0.0,
        label_noise: float = 0.0,
        min_len: int | None = None,
        loader_delay_ms: float = 0.0,
        near_duplicate_frac: float = 0.0,
        dedup: bool = False,
    ) -> None:
        for key, value, low in (
            ("data.vocab_size", vocab_size, 2),
            ("model.seq_len", seq_len, 1),
            ("data.source.n_train", n_train, 1),
            ("data.source.n_heldout", n_heldout, 1),
        ):
            if int(value) < low:
                raise ValueError(f"{key.split('.')[-1]}={value} must be >= {low}: set {key}")
        if not 1 <= int(branching) <= int(vocab_size):
            raise ValueError(
                f"branching={branching} must be in [1, vocab_size={vocab_size}]: "
                "set data.source.branching"
            )
        if min_len is not None and not 1 <= int(min_len) <= int(seq_len):
            raise ValueError(
                f"min_len={min_len} must be in [1, seq_len={seq_len}] or null: "
                "set data.source.min_len"
            )
        if float(loader_delay_ms) < 0:
            raise ValueError(
                f"loader_delay_ms={loader_delay_ms} must be >= 0: set data.source.loader_delay_ms"
            )
        _check_fraction("copy_prob", float(copy_prob))
        _check_fraction("duplicate_frac", float(duplicate_frac), upper_open=True)
        _check_fraction("label_noise", float(label_noise))
        if not 0.0 <= float(near_duplicate_frac) <= 0.5:
            raise ValueError(
                f"near_duplicate_frac={near_duplicate_frac} must be in [0, 0.5] (each near copy "
                "needs its own source row): set data.source.near_duplicate_frac"
            )
        self.vocab_size = int(vocab_size)
        self.seq_len = int(seq_len)
        self.n_train = int(n_train)
        self.n_heldout = int(n_heldout)
        self.language_seed = int(language_seed)
        self.branching = int(branching)
        self.copy_prob = float(copy_prob)
        self.duplicate_frac = float(duplicate_frac)
        self.label_noise = float(label_noise)
        self.min_len = None if min_len is None else int(min_len)
        self.loader_delay_ms = float(loader_delay_ms)
        self.near_duplicate_frac = float(near_duplicate_frac)
        self.dedup = bool(dedup)
        self.pools()  # generate now, so bad settings fail at construction

    def pools(self) -> Pools:
        """The cached pools; looked up per call so pickling a Synthetic carries no arrays."""
        return build_pools(
            self.vocab_size,
            self.seq_len,
            self.n_train,
            self.n_heldout,
            self.language_seed,
            self.branching,
            self.copy_prob,
            self.duplicate_frac,
            self.label_noise,
            self.min_len,
            self.near_duplicate_frac,
            self.dedup,
        )

    def train(self, start: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Stream sequences start..start+count-1: the pool in (seed, epoch) permutations."""
        check_span(start, count)
        if self.loader_delay_ms > 0:
            time.sleep(self.loader_delay_ms / 1000.0)
        pools = self.pools()
        rows = pool_indices(start, count, seed, self.pool_size)
        return torch.from_numpy(pools.x_train[rows]), torch.from_numpy(pools.y_train[rows])

    @property
    def pool_size(self) -> int:
        """Rows in the training pool (n_train, fewer after dedup): one epoch visits each once."""
        return len(self.pools().x_train)

    def heldout(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `count` held-out sequences (copies, so callers may modify them)."""
        if not 0 <= count <= self.n_heldout:
            raise ValueError(
                f"heldout(count={count}) but the held-out pool has n_heldout={self.n_heldout}: "
                "ask for fewer held-out sequences or raise data.source.n_heldout"
            )
        pools = self.pools()
        return (
            torch.from_numpy(pools.x_heldout[:count].copy()),
            torch.from_numpy(pools.y_heldout[:count].copy()),
        )

    def describe(self) -> dict[str, float | int | str]:
        """Measured facts of the train pool (what a diagnosis compares against)."""
        pools = self.pools()
        x, y = pools.x_train, pools.y_train
        return {
            "source": "Synthetic",
            "vocab_size": self.vocab_size,
            "seq_len": self.seq_len,
            "n_train": self.n_train,
            "n_heldout": self.n_heldout,
            "unique_frac": len(set(row_keys(x))) / len(x),
            "pad_frac": float((y == IGNORE_INDEX).mean()),
            "copy_frac": pools.copy_frac,
            "duplicate_frac": self.duplicate_frac,
            "near_duplicate_frac": self.near_duplicate_frac,
            "dedup": int(self.dedup),
            "pool_size": len(x),
            "label_noise": self.label_noise,
            "bigram_entropy": bigram_entropy(x, y),
            "uniform_entropy": math.log(self.vocab_size),
            "loader_delay_ms": self.loader_delay_ms,
        }
