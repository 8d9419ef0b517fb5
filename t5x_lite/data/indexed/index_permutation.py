"""A seeded permutation of [0, size) evaluated at any index, in O(1) memory: a Feistel network.

`permute(positions, size=N, seed=S)[i]` is the index that position i of the shuffled order reads.
It is a bijection of [0, N) for every N and seed, computed position by position (no table of N
entries), so the i-th element of an epoch's order costs the same at i = 0 and i = 10^9.

How: a balanced Feistel network over the smallest even number of bits b with 2^b >= N (each of
6 rounds mixes one half with a 64-bit hash of the other half and a round key drawn from the
seed) is a permutation of [0, 2^b); "cycle walking" (apply it again while the result is >= N)
restricts it to [0, N). Since 2^b < 4N, a position walks fewer than 4 times on average.
"""

from __future__ import annotations

import numpy as np

_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64's finalizer constants
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a fast 64-bit hash with full avalanche."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _round_keys(seed: int) -> np.ndarray:
    return np.random.SeedSequence([seed, 0x5EED]).generate_state(_ROUNDS, np.uint64)


def _half_bits(size: int) -> int:
    bits = max(2, int(size - 1).bit_length())
    return (bits + 1) // 2


def _feistel(x: np.ndarray, half: int, keys: np.ndarray) -> np.ndarray:
    mask = np.uint64((1 << half) - 1)
    shift = np.uint64(half)
    left, right = x >> shift, x & mask
    for key in keys:
        left, right = right, left ^ (_mix(right ^ key) & mask)
    return (left << shift) | right


def permute(positions: np.ndarray | int, *, size: int, seed: int) -> np.ndarray:
    """The indices that `positions` (each in [0, size)) read in the permutation of [0, size) fixed by `seed`."""
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    x = np.asarray(positions, dtype=np.int64)
    if x.size and (x.min() < 0 or x.max() >= size):
        raise ValueError(f"positions must lie in [0, {size})")
    if size == 1:
        return np.zeros_like(x)
    half, keys, limit = _half_bits(size), _round_keys(seed), np.uint64(size)
    with np.errstate(over="ignore"):  # the hash multiplies modulo 2^64 on purpose
        y = _feistel(x.astype(np.uint64), half, keys)
        outside = y >= limit
        while outside.any():
            y[outside] = _feistel(y[outside], half, keys)
            outside = y >= limit
    return y.astype(np.int64)
