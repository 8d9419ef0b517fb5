"""A deterministic mixing schedule: which task the i-th row of a mixture comes from, for any i.

Positions are cut into blocks of BLOCK. Each block holds exactly `counts[k]` rows of task k
(the rates apportioned to BLOCK by largest remainder, so rates hold to 1/BLOCK in every block),
in an order shuffled per block by the seed. So the task of position i, and how many rows of
that task came before it, are computed from i alone: a resumed run continues the schedule at
any position at the cost of one block.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from t5x_lite.data.indexed import index_permutation

BLOCK = 8192


def apportion(rates: Sequence[float], block: int = BLOCK) -> np.ndarray:
    """Integer counts per task summing to `block`, proportional to `rates` (largest remainder)."""
    rates = np.asarray(rates, np.float64)
    if rates.ndim != 1 or not len(rates) or (rates <= 0).any():
        raise ValueError(f"rates must be positive, got {rates.tolist()}")
    exact = rates / rates.sum() * block
    counts = np.floor(exact).astype(np.int64)
    remainder_order = np.argsort(-(exact - counts), kind="stable")
    counts[remainder_order[:block - counts.sum()]] += 1
    if (counts == 0).any():
        raise ValueError(f"a rate of {rates.min() / rates.sum():.2g} of the total is below the schedule's "
                         f"resolution (1/{block}); raise it or drop the task")
    return counts


@functools.lru_cache(maxsize=4)
def _block(block_index: int, counts: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(task of each position in the block, its rank among the block's positions of that task)."""
    tasks = np.repeat(np.arange(len(counts)), counts)
    order = tasks[index_permutation.permute(np.arange(len(tasks)), size=len(tasks), seed=seed + 7919 * block_index)]
    rank = np.empty(len(order), np.int64)
    for k in range(len(counts)):
        where = np.flatnonzero(order == k)
        rank[where] = np.arange(len(where))
    return order, rank


def schedule(positions: np.ndarray, *, counts: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(task, use index) of each position: position i is the `use`-th row taken from `task`."""
    positions = np.asarray(positions, np.int64)
    block_size = int(counts.sum())
    tasks = np.empty(len(positions), np.int64)
    uses = np.empty(len(positions), np.int64)
    blocks = positions // block_size
    for b in np.unique(blocks):
        here = blocks == b
        order, rank = _block(int(b), tuple(int(c) for c in counts), seed)
        within = positions[here] % block_size
        tasks[here] = order[within]
        uses[here] = b * counts[order[within]] + rank[within]
    return tasks, uses
