"""The corpus app's data: a synthetic two-topic Markov language, padded to a fixed length.

Each topic is a fixed random chain (the task's seed is a constant, so every run learns the same
language) in which a token has three likely successors; a sequence is one topic's walk of a
drawn length, padded with PAD. The best reachable loss is the chains' entropy, well above 0, so
a bug that stops learning and one that slows it read differently.
"""

from __future__ import annotations

import torch

PAD = 0
IGNORE = -100
TASK_SEED = 20261202
"""The language itself; fixed, unlike the draw of sequences (data.seed, data.eval_seed)."""
SUCCESSOR_PROBS = (0.6, 0.3, 0.1)


def transitions(vocab: int) -> torch.Tensor:
    """[2 topics, vocab, vocab] next-token probabilities; PAD is never emitted."""
    generator = torch.Generator().manual_seed(TASK_SEED)
    table = torch.zeros(2, vocab, vocab)
    for topic in range(2):
        for token in range(vocab):
            successors = torch.randperm(vocab - 1, generator=generator)[:3] + 1
            table[topic, token, successors] = torch.tensor(SUCCESSOR_PROBS)
    return table


def sequences(count: int, vocab: int, seq_len: int, min_len: int, seed: int) -> dict:
    """`count` sequences of seq_len + 1 ids: inputs x, next-token targets y (IGNORE at padding),
    the padded ids themselves, and each sequence's topic."""
    generator = torch.Generator().manual_seed(seed)
    table = transitions(vocab)
    topic = torch.randint(0, 2, (count,), generator=generator)
    ids = torch.empty(count, seq_len + 1, dtype=torch.long)
    ids[:, 0] = torch.randint(1, vocab, (count,), generator=generator)
    for position in range(1, seq_len + 1):
        probs = table[topic, ids[:, position - 1]]
        ids[:, position] = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    length = torch.randint(min_len, seq_len + 2, (count,), generator=generator)
    padded = torch.arange(seq_len + 1) >= length[:, None]
    ids[padded] = PAD
    y = ids[:, 1:].clone()
    y[padded[:, 1:]] = IGNORE
    return {"x": ids[:, :-1], "y": y, "topic": topic}


def batch_order(data: dict, batch: int, seed: int, epoch: int, shuffled: bool) -> list:
    """One epoch's batches of row indices: a fresh permutation per epoch, or (a loader without
    shuffling over data stored by topic) the rows sorted by topic, the same every epoch."""
    count = len(data["topic"])
    if shuffled:
        rows = torch.randperm(count, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    else:
        rows = torch.argsort(data["topic"], stable=True)
    return [rows[i : i + batch] for i in range(0, count - batch + 1, batch)]


def weighted_order(data: dict, batch: int, seed: int, epoch: int, per_class: bool) -> list:
    """One epoch of a WeightedRandomSampler (len(data) draws with replacement) balancing the
    topics: each row weighted by 1 / its topic's count, or (per_class) the per-topic weights
    given as they are, so the sampler draws row indices 0 and 1 only."""
    topic = data["topic"]
    class_weights = 1.0 / torch.bincount(topic, minlength=2).double()
    weights = class_weights if per_class else class_weights[topic]
    generator = torch.Generator().manual_seed(seed * 1000 + epoch)
    rows = torch.multinomial(weights, len(topic), replacement=True, generator=generator)
    return [rows[i : i + batch] for i in range(0, len(rows) - batch + 1, batch)]
