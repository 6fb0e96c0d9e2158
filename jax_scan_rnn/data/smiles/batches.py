"""Splitting a data set into train/valid/test parts, and the batches of a training run.

    train, valid, test = split(sequences, (0.8, 0.1, 0.1), seed=0)    # sizes: split_sizes(n, fractions)
    batch_tokens, batch_lengths = batch_at(tokens, lengths, batch_size=128, step=step, seed=0)
    batch_tokens, batch_lengths = batch_at(tokens, lengths, 128, step, pool=100)  # rows of similar lengths,
    batch_tokens = trim(batch_tokens, batch_lengths)                            # padded to their longest

Both are pure functions of their arguments, so a resumed run sees exactly the data an uninterrupted one
would.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from jax_scan_rnn.validate import integer


def _check_fractions(fractions: Sequence[float]) -> np.ndarray:
    fractions = np.asarray(fractions, dtype=np.float64)
    if fractions.ndim != 1 or fractions.size == 0 or (fractions < 0).any() or abs(fractions.sum() - 1.0) > 1e-6:
        raise ValueError(f"fractions: expected non-negative numbers summing to 1, got {fractions.tolist()}")
    return fractions


def _part_sizes(counts: np.ndarray, fractions: np.ndarray) -> np.ndarray:
    """[len(counts), len(fractions)]: the sizes of `split`'s parts for each number of sequences in `counts`."""
    bounds = np.round(np.cumsum(fractions)[None, :] * counts[:, None]).astype(np.int64)
    bounds[:, -1] = counts
    return np.diff(bounds, axis=1, prepend=0)


def split_sizes(n: int, fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> tuple[int, ...]:
    """The sizes of the parts `split` makes of `n` sequences with `fractions` (they add up to n).

    Part sizes are differences of round(cumsum(fractions) * n) (NumPy's round: half to even).
    """
    fractions = _check_fractions(fractions)
    n = integer("n", n, lo=0)
    return tuple(int(k) for k in _part_sizes(np.asarray([n]), fractions)[0])


def split(sequences: Sequence, fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0) -> tuple[list, ...]:
    """Deterministic random split of `sequences` into len(fractions) disjoint parts of `split_sizes`.

    The same (len(sequences), fractions, seed) always gives the same parts; each part keeps the input
    order. Parts are disjoint by position; de-duplicate first (`load_sequences` does) so that they are
    disjoint by value.
    """
    sequences = list(sequences)
    sizes = split_sizes(len(sequences), fractions)
    order = np.random.default_rng(integer("seed", seed, lo=0)).permutation(len(sequences))
    return tuple([sequences[i] for i in np.sort(part)] for part in np.split(order, np.cumsum(sizes)[:-1]))


def min_split_size(fractions: Sequence[float], minimums: Sequence[int]) -> int:
    """Fewest sequences N for which `split(..., fractions)` gives part i at least `minimums[i]` sequences,
    for N and for every larger N (rounding makes the part sizes step unevenly, so the first N that works
    is not always the threshold).

    Part i of N sequences holds fractions[i] * N +- 1 (rounding moves each bound by at most 1/2), so every
    N >= (minimums[i] + 1) / fractions[i] works for it and every N < (minimums[i] - 1) / fractions[i] fails;
    only the N between are tried (a few per part, however large the minimums: a batch size of 10^9 too).
    """
    fractions = _check_fractions(fractions)
    minimums = np.asarray(minimums)
    if minimums.shape != fractions.shape or not np.issubdtype(minimums.dtype, np.integer) or (minimums < 0).any():
        raise ValueError(f"minimums: expected {fractions.size} ints >= 0, one per fraction, got {minimums.tolist()}")
    needed = minimums > 0
    if (fractions[needed] == 0).any():
        raise ValueError(
            f"minimums: expected 0 for a part of fraction 0 (it is always empty), got {minimums.tolist()} for "
            f"fractions {fractions.tolist()}"
        )
    upper = int(np.max(np.ceil((minimums[needed] + 1) / fractions[needed]), initial=0)) + 1
    # 2 below the failing bound's ceiling: strictly below the bound even where float division lands above it.
    lower = max(0, int(np.max(np.ceil((minimums[needed] - 1) / fractions[needed]), initial=0)) - 2)
    counts = np.arange(lower, upper + 1)
    works = (_part_sizes(counts, fractions) >= minimums).all(axis=1)
    failing = np.flatnonzero(~works)
    return int(counts[failing[-1]]) + 1 if failing.size else lower


@functools.lru_cache(maxsize=4)  # one permutation serves the N // batch_size steps of an epoch
def _epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    perm.setflags(write=False)
    return perm


@functools.lru_cache(maxsize=4)
def _batch_order(num_batches: int, seed: int, epoch: int) -> np.ndarray:
    order = np.random.default_rng([seed, epoch, 1]).permutation(num_batches)
    order.setflags(write=False)
    return order


def batch_at(tokens, lengths, batch_size: int, step: int, seed: int = 0, pool: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Batch number `step` of shuffled epochs: a pure function of (data, batch_size, step, seed, pool).

    Epoch e = step // (N // batch_size) visits the rows in the order of a permutation seeded by
    (seed, e); batch i of it is rows perm[i * batch_size : (i + 1) * batch_size]. The last
    N % batch_size rows of each permutation are left out (a different few each epoch), so every batch
    has the same shape. Resuming at step s gives exactly the batches an uninterrupted run would.

    pool > 0 groups rows of similar lengths (bucketing, as torchtext's BucketIterator does): the epoch's
    permutation is cut into pools of `pool` batches, each pool's rows are sorted by length (stable) and
    cut into batches, and the epoch visits its batches in the order of a second permutation seeded by
    (seed, e, 1). Every row is still visited once per epoch; `trim` then pads each batch only to its
    longest row.

    Args:
        tokens: [N, T] token ids; lengths: [N].
    Returns:
        (tokens [batch_size, T], lengths [batch_size]).
    """
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    if tokens.ndim != 2:
        raise ValueError(f"tokens: expected a [N, T] array, got shape {tokens.shape}")
    if lengths.shape != tokens.shape[:1]:
        raise ValueError(f"lengths: expected shape ({tokens.shape[0]},) to match tokens, got {lengths.shape}")
    n = tokens.shape[0]
    batch_size = integer("batch_size", batch_size, lo=1, hi=n)
    step, seed, pool = integer("step", step, lo=0), integer("seed", seed, lo=0), integer("pool", pool, lo=0)
    num_batches = n // batch_size
    epoch, index = divmod(step, num_batches)
    perm = _epoch_permutation(n, seed, epoch)
    if pool:
        index = int(_batch_order(num_batches, seed, epoch)[index])
        first = index // pool * pool  # the pool's first batch
        rows = perm[first * batch_size : min(first + pool, num_batches) * batch_size]
        rows, index = rows[np.argsort(lengths[rows], kind="stable")], index - first
    else:
        rows = perm
    rows = rows[index * batch_size : (index + 1) * batch_size]
    return tokens[rows], lengths[rows]


def trim(tokens, lengths, multiple: int = 8) -> np.ndarray:
    """[B, T] tokens cut to [B, W]: W = the longest of `lengths` rounded up to `multiple`, at most T.

    The columns cut hold only padding; rounding bounds the shapes a compiled step sees to T / multiple.
    """
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    multiple = integer("multiple", multiple, lo=1)
    longest = int(lengths.max(initial=0))
    if longest > tokens.shape[1]:
        raise ValueError(f"lengths: expected at most T={tokens.shape[1]} (the tokens' columns), got {longest}")
    return tokens[:, : min(tokens.shape[1], -(-longest // multiple) * multiple)]
