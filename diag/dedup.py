"""Exact and near duplicates among token sequences: hashing rows, and MinHash + LSH on n-grams.

Duplicated training data makes a model memorise instead of generalise, and a held-out row that
also sits in the training set makes eval loss look better than it is. Rows are compared by
their real (non-padding) tokens only, so two sequences that differ only in padding are equal.

Rows come as a 2-D integer array with an optional boolean `mask` (True = real token), or as a
list of 1-D arrays of different lengths. Everything is numpy-vectorised: 8192 rows of 64 tokens
take well under a second.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Rows = np.ndarray | Sequence[np.ndarray]

FILL = -1  # marks the unused tail of a compacted row; never a real token id
MAX64 = np.iinfo(np.uint64).max
MIX = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant (golden ratio) for hash mixing


def compact(rows: Rows, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Real tokens of each row moved to the front, the rest FILL; returns (tokens, lengths).

    After compaction two rows are equal exactly when their sequences of real tokens are equal.
    """
    if not isinstance(rows, list | tuple):  # a 2-D numpy array or torch tensor
        x = np.asarray(rows, dtype=np.int64)
        if x.ndim != 2:
            raise ValueError(f"rows must be 2-D [n, T], got shape {x.shape}")
        real = np.ones(x.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
        if real.shape != x.shape:
            raise ValueError(f"mask shape {real.shape} differs from rows shape {x.shape}")
        order = np.argsort(~real, axis=1, kind="stable")  # real tokens first, order kept
        tokens = np.take_along_axis(np.where(real, x, FILL), order, axis=1)
        return tokens, real.sum(axis=1)
    if mask is not None:
        raise ValueError("mask applies to a 2-D array; pass 1-D rows already without padding")
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    tokens = np.full((len(rows), int(lengths.max(initial=0))), FILL, dtype=np.int64)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = np.asarray(r, dtype=np.int64)
    return tokens, lengths


def _keys(tokens: np.ndarray, width: int) -> list[bytes]:
    """Hashable bytes per compacted row, padded to a common width so arrays can be compared."""
    if tokens.shape[1] < width:
        pad = np.full((len(tokens), width - tokens.shape[1]), FILL, dtype=np.int64)
        tokens = np.concatenate([tokens, pad], axis=1)
    return [row.tobytes() for row in np.ascontiguousarray(tokens)]


def first_occurrences(rows: Rows, mask: np.ndarray | None = None) -> np.ndarray:
    """Boolean per row: True where this row's content has not appeared in an earlier row."""
    tokens, _ = compact(rows, mask)
    seen: set[bytes] = set()
    first = np.zeros(len(tokens), dtype=bool)
    for i, key in enumerate(_keys(tokens, tokens.shape[1])):
        if key not in seen:
            seen.add(key)
            first[i] = True
    return first


def exact_duplicate_ratio(rows: Rows, mask: np.ndarray | None = None) -> float:
    """Fraction of rows whose exact content (real tokens) appeared in an earlier row."""
    first = first_occurrences(rows, mask)
    return float(1.0 - first.mean()) if len(first) else 0.0


def overlap_ratio(
    a_rows: Rows,
    b_rows: Rows,
    a_mask: np.ndarray | None = None,
    b_mask: np.ndarray | None = None,
) -> float:
    """Fraction of the rows of `a` whose content equals some row of `b` (e.g. held-out in train)."""
    a_tokens, _ = compact(a_rows, a_mask)
    b_tokens, _ = compact(b_rows, b_mask)
    if len(a_tokens) == 0:
        return 0.0
    width = max(a_tokens.shape[1], b_tokens.shape[1])
    in_b = set(_keys(b_tokens, width))
    return float(np.mean([key in in_b for key in _keys(a_tokens, width)]))


def _finalise(h: np.ndarray) -> np.ndarray:
    """A 64-bit avalanche (splitmix64's finaliser), so nearby inputs give unrelated hashes."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def shingle_hashes(tokens: np.ndarray, lengths: np.ndarray, ngram: int) -> tuple[np.ndarray, ...]:
    """64-bit hashes of every token n-gram [n, S] and which of them lie inside the row [n, S].

    A row shorter than `ngram` (but not empty) gets a single shingle: the whole row.
    """
    n, width = tokens.shape
    if width < ngram:
        pad = np.full((n, ngram - width), FILL, dtype=np.int64)
        tokens, width = np.concatenate([tokens, pad], axis=1), ngram
    n_shingles = width - ngram + 1
    words = tokens.astype(np.uint64)  # FILL becomes 2**64 - 1, a value no token takes
    h = np.zeros((n, n_shingles), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(ngram):
            h = _finalise((h ^ words[:, k : k + n_shingles]) * MIX + np.uint64(k))
    valid = np.arange(n_shingles)[None, :] + ngram <= lengths[:, None]
    valid[:, 0] |= (lengths > 0) & (lengths < ngram)
    return h, valid


def minhash_signatures(
    hashes: np.ndarray, valid: np.ndarray, num_perm: int = 64, seed: int = 0
) -> np.ndarray:
    """MinHash signature [n, num_perm]: per random hash function, the minimum over a row's set.

    Hash functions are multiply-add mod 2**64 followed by the finaliser; two rows agree in one
    signature entry with probability equal to the Jaccard similarity of their shingle sets.
    """
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 2**63, num_perm, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 2**63, num_perm, dtype=np.uint64)
    signatures = np.empty((len(hashes), num_perm), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for p in range(num_perm):
            v = _finalise(hashes * a[p] + b[p])
            v[~valid] = MAX64
            signatures[:, p] = v.min(axis=1)
    return signatures


def lsh_candidates(signatures: np.ndarray, bands: int) -> np.ndarray:
    """Pairs (i, j), i < j, that agree on all rows of at least one band of the signature.

    Within a bucket each row is paired with the bucket's earliest row only, which keeps the
    pair count linear; a near-duplicate missed in one band is usually caught in another.
    """
    n, num_perm = signatures.shape
    rows_per_band = num_perm // bands
    pairs = []
    with np.errstate(over="ignore"):
        for band in range(bands):
            key = np.zeros(n, dtype=np.uint64)
            for col in range(band * rows_per_band, (band + 1) * rows_per_band):
                key = _finalise((key ^ signatures[:, col]) * MIX)
            order = np.argsort(key, kind="stable")  # stable: earliest row first in a bucket
            sorted_keys = key[order]
            starts = np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]
            first = order[np.flatnonzero(starts)][np.cumsum(starts) - 1]
            later = order != first
            pairs.append(np.stack([first[later], order[later]], axis=1))
    if not pairs:
        return np.empty((0, 2), dtype=np.int64)
    return np.unique(np.concatenate(pairs), axis=0)


def jaccard(hashes: np.ndarray, valid: np.ndarray, pairs: np.ndarray, chunk: int = 4096):
    """Exact Jaccard similarity of the shingle sets of each pair, by chunked broadcasting."""
    sets = np.where(valid, hashes, MAX64)
    sets.sort(axis=1)
    sets[:, 1:][sets[:, 1:] == sets[:, :-1]] = MAX64  # drop repeats: a row's shingles as a set
    sizes = (sets != MAX64).sum(axis=1)
    out = np.empty(len(pairs))
    for start in range(0, len(pairs), chunk):
        i, j = pairs[start : start + chunk].T
        a, b = sets[i], sets[j]
        shared = ((a[:, :, None] == b[:, None, :]) & (a[:, :, None] != MAX64)).any(axis=2)
        inter = shared.sum(axis=1)
        out[start : start + chunk] = inter / np.maximum(sizes[i] + sizes[j] - inter, 1)
    return out


def cluster_labels(n: int, pairs: np.ndarray) -> np.ndarray:
    """Connected components of the graph with `n` nodes and edges `pairs`: the smallest index
    in each node's component, by min-label propagation with pointer jumping."""
    label = np.arange(n)
    i, j = pairs.T if len(pairs) else (np.empty(0, int), np.empty(0, int))
    while True:
        low = np.minimum(label[i], label[j])
        new = label.copy()
        np.minimum.at(new, i, low)
        np.minimum.at(new, j, low)
        new = new[new]  # labels point into the same component: jump to its root
        if np.array_equal(new, label):
            return label
        label = new


def near_duplicate_mask(
    rows: Rows,
    threshold: float = 0.8,
    ngram: int = 5,
    num_perm: int = 64,
    seed: int = 0,
    mask: np.ndarray | None = None,
    bands: int = 16,
) -> np.ndarray:
    """Boolean per row: True where a near-dedup would remove the row, beyond exact copies.

    Rows are joined when the Jaccard similarity of their sets of token `ngram`-shingles is
    >= threshold, transitively (a cluster of edits of one text is one cluster even if two
    edits differ more than the threshold allows); every row but the earliest of its cluster is
    marked. MinHash (`num_perm` hash functions) and LSH (`bands` bands of num_perm/bands rows;
    with 16x4, a pair at Jaccard 0.8 becomes a candidate with probability ~0.9999, at 0.3
    ~0.12) find candidate pairs; each candidate's Jaccard is then computed exactly, so the
    result has no MinHash estimation noise. Exact copies are left to `first_occurrences`
    (they are never marked here), so the two counts add up rather than overlap.
    """
    if num_perm % bands:
        raise ValueError(f"num_perm={num_perm} must be a multiple of bands={bands}")
    tokens, lengths = compact(rows, mask)
    near = np.zeros(len(tokens), dtype=bool)
    keep = np.flatnonzero(first_occurrences(tokens) & (lengths > 0))
    if len(keep) == 0:
        return near
    hashes, valid = shingle_hashes(tokens[keep], lengths[keep], ngram)
    signatures = minhash_signatures(hashes, valid, num_perm, seed)
    pairs = lsh_candidates(signatures, bands)
    similar = pairs[jaccard(hashes, valid, pairs) >= threshold]
    labels = cluster_labels(len(keep), similar)
    near[keep] = labels != np.arange(len(keep))  # a label is its cluster's earliest row
    return near


def near_duplicate_ratio(rows: Rows, **options) -> float:
    """Fraction of rows a near-dedup would remove, beyond exact copies (see
    `near_duplicate_mask` for the options)."""
    near = near_duplicate_mask(rows, **options)
    return float(near.mean()) if len(near) else 0.0


def deduplicated(rows: Rows, mask: np.ndarray | None = None, **options) -> np.ndarray:
    """Indices of the rows an exact + near dedup keeps: the first of each cluster, in order."""
    near = near_duplicate_mask(rows, mask=mask, **options)
    return np.flatnonzero(first_occurrences(rows, mask) & ~near)
