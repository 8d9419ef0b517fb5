"""Host-local batches read by index: a global shuffle per epoch and a resume that costs the same anywhere.

A task's split is a stream of packed rows (data/indexed/token_rows.py: documents + EOS cut into rows of
the sequence length), numbered 0..R-1 from its offset index. Epoch e visits a permutation of
all R rows (data/indexed/index_permutation.py, seeded by (seed, epoch, task)); step t of the epoch takes
positions [t * G, (t + 1) * G) of that order for a global batch of G rows, and data shard s of
D takes its G / D consecutive positions of them. An epoch therefore has ceil(R / G) steps on
every shard and process, known from the index without a counting pass; positions past R (the
last step's remainder) are empty rows with zero loss weight, so every row is read exactly once
per epoch over all shards.

A mixture's positions are spread over its tasks by a deterministic schedule (data/indexed/mixing.py):
position i is the u-th row taken from task k, which is row u mod R_k of task k's epoch
u div R_k. Each task runs through its own epochs; one epoch of the mixture is as many positions
as its scarcest task (rows per unit of rate) fills in one of its epochs, as with seqio's default.

The state is (epoch, batches taken in the epoch): restoring it computes the next batch
directly, whatever the position. The next batch is read in a background thread while the
current one trains.
"""

from __future__ import annotations

import concurrent.futures
import itertools
from typing import Any

import numpy as np

from t5x_lite.data.indexed import epochs, index_permutation, mixing, token_rows
from t5x_lite.data.indexed.index_plan import IndexPlan
from t5x_lite.data.records import record_index
from t5x_lite.errors import UserError


class DataPositionError(UserError, ValueError):
    """A saved data position that this run cannot continue exactly."""


def task_epoch_seed(seed: int, epoch: int, task: int) -> int:
    """The permutation seed of one task's epoch."""
    return int(np.random.SeedSequence([seed, epoch, task, 0x1D]).generate_state(1, np.uint32)[0])


class IndexedBatchIterator:
    """Host-local numpy batches over `num_epochs` epochs (None: forever), read by index; checkpointable.

    The interface of input_pipeline.BatchIterator: `epoch`, `batches_in_epoch`, `end_of_epoch`,
    `last_epoch_stats`, `steps_in_epoch`, `get_state` / `set_state`, `prepare`, `close`.
    """

    reader = "index"

    def __init__(self, plan: IndexPlan, *, num_epochs: int | None, host_batch_size: int,
                 shard_index: int = 0, num_shards: int = 1):
        self.plan = plan
        self.num_epochs = num_epochs
        self.host_batch_size = host_batch_size
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.global_batch = host_batch_size * num_shards
        rates = [t.rate for t in plan.tasks]
        epoch = epochs.indexed_epoch([t.records.stream_tokens for t in plan.tasks], rates, length=plan.length,
                                     global_batch=self.global_batch)
        self.rows = list(epoch.rows)
        self.positions_per_epoch = epoch.positions
        self.steps_per_epoch = epoch.steps
        self._counts = mixing.apportion(rates) if len(plan.tasks) > 1 else None  # the mixing schedule's
        self.epoch = 0
        self.batches_in_epoch = 0
        self.end_of_epoch = False
        self.last_epoch_stats: dict[str, int] = {}
        self._stats = {"rows": 0, "tokens": 0}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._ahead: tuple[tuple[int, int], concurrent.futures.Future] | None = None

    def describe(self) -> str:
        """The start-up line's account of what is read and how."""
        tasks = ", ".join(f"{t.name!r} ({r:,} rows)" for t, r in zip(self.plan.tasks, self.rows))
        order = "a global shuffle per epoch" if self.plan.shuffle else "in index order"
        return (f"read by index: {self.steps_per_epoch:,} steps per epoch of {tasks} of {self.plan.length} tokens, "
                f"{order}; {self.num_shards} data shard(s) of {self.host_batch_size} rows")

    def steps_in_epoch(self, epoch: int) -> int:
        return self.steps_per_epoch

    # ------------------------------------------------------------------------------ rows

    def _task_rows(self, task: int, epoch: int, positions: np.ndarray) -> np.ndarray:
        if not self.plan.shuffle or not len(positions):
            return positions
        return index_permutation.permute(positions, size=self.rows[task],
                                         seed=task_epoch_seed(self.plan.seed, epoch, task))

    def rows_of_batch(self, epoch: int, batch: int) -> list[tuple[int, int] | None]:
        """(task, row) of each of this shard's rows in batch `batch` of `epoch` (None: an empty row)."""
        first = batch * self.global_batch + self.shard_index * self.host_batch_size
        positions = np.arange(first, first + self.host_batch_size, dtype=np.int64)
        if self._counts is None:
            real = positions[positions < self.rows[0]]
            rows = self._task_rows(0, epoch, real)
            return [(0, int(r)) for r in rows] + [None] * (len(positions) - len(real))
        absolute = positions + epoch * self.steps_per_epoch * self.global_batch
        tasks, uses = mixing.schedule(absolute, counts=self._counts, seed=self.plan.seed)
        out: list[tuple[int, int] | None] = [None] * len(positions)
        for k in np.unique(tasks):
            where = np.flatnonzero(tasks == k)
            rows_k = self.rows[k]
            for task_epoch in np.unique(uses[where] // rows_k):
                at = where[uses[where] // rows_k == task_epoch]
                for i, row in zip(at, self._task_rows(int(k), int(task_epoch), uses[at] % rows_k)):
                    out[i] = (int(k), int(row))
        return out

    def _read_batch(self, epoch: int, batch: int) -> dict[str, np.ndarray]:
        length = self.plan.length
        wanted = self.rows_of_batch(epoch, batch)
        spans, needed = [], []
        for entry in wanted:
            if entry is None:
                spans.append(None)
                continue
            task, row = entry
            records = self.plan.tasks[task].records
            span = token_rows.row_span(row, length=length, stream_tokens=records.stream_tokens)
            covering = records.records_covering(*span)
            spans.append((task, span, covering))
            needed.extend((task, r) for r in covering)
        tokens = self._read_records(needed)
        batch_rows = []
        for entry in spans:
            if entry is None:
                batch_rows.append(token_rows.empty_rows(1, length))
                continue
            task, span, covering = entry
            records = self.plan.tasks[task].records
            pieces = token_rows.pieces_of_row([tokens[(task, r)] for r in covering],
                                              [records.stream_start(r) for r in covering],
                                              span=span, eos_id=self.plan.eos_id)
            row = token_rows.lm_row(pieces, length=length, start_id=self.plan.start_id)
            batch_rows.append({k: v[None] for k, v in row.items()})
        return {k: np.concatenate([r[k] for r in batch_rows]) for k in token_rows.FEATURES}

    def _read_records(self, needed: list[tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
        """The tokens of each (task, record) needed, read once each and parsed in one call."""
        unique = sorted(set(needed))  # task by task: each task's records are read in this order
        raw = [data for task, keys in itertools.groupby(unique, key=lambda key: key[0])
               for data in self.plan.tasks[task].records.read(record for _, record in keys)]
        return dict(zip(unique, record_index.parse_targets(raw)))

    # ------------------------------------------------------------------------------ iterating

    def _submit(self, key: tuple[int, int]) -> None:
        if self.num_epochs is not None and key[0] >= self.num_epochs:
            return
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="read-ahead")
        self._ahead = (key, self._executor.submit(self._read_batch, *key))

    def prepare(self) -> None:
        """Reads the next batch now (its errors surface here); it is returned next."""
        key = (self.epoch, self.batches_in_epoch)
        if self._ahead is None or self._ahead[0] != key:
            self._submit(key)
        if self._ahead is not None:
            self._ahead[1].result()

    def __iter__(self) -> "IndexedBatchIterator":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.num_epochs is not None and self.epoch >= self.num_epochs:
            raise StopIteration
        key = (self.epoch, self.batches_in_epoch)
        if self._ahead is not None and self._ahead[0] == key:
            batch = self._ahead[1].result()
        else:
            batch = self._read_batch(*key)
        self._ahead = None
        weights = batch["decoder_loss_weights"]
        self._stats["rows"] += int(weights.any(axis=1).sum())
        self._stats["tokens"] += int(weights.sum())
        self.batches_in_epoch += 1
        self.end_of_epoch = False
        if self.batches_in_epoch == self.steps_per_epoch:
            self.last_epoch_stats, self._stats = self._stats, {"rows": 0, "tokens": 0}
            self.epoch, self.batches_in_epoch = self.epoch + 1, 0
            self.end_of_epoch = True
        self._submit((self.epoch, self.batches_in_epoch))
        return batch

    # ------------------------------------------------------------------------------ state

    def get_state(self) -> dict[str, Any]:
        """A small JSON-able state. Positions are global: every shard is at the same one, so one state
        restores all, for any number of data shards with the same global batch."""
        return {"reader": self.reader, "epoch": self.epoch, "batches_in_epoch": self.batches_in_epoch,
                "steps_in_epoch": self.steps_per_epoch, "global_batch": self.global_batch, "rows": self.rows,
                "shard_index": self.shard_index, "num_shards": self.num_shards}

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get("reader") != self.reader:
            raise DataPositionError(
                "The checkpoint's data position was saved by the streaming reader, but this run reads the data "
                "by index (the data now has an index): the two orders differ, so the position cannot be continued "
                "exactly. Resume with --gin.train/DataConfig.reader=\"'stream'\".")
        saved = (int(state["steps_in_epoch"]), int(state.get("global_batch", self.global_batch)),
                 list(state.get("rows", self.rows)))
        if saved != (self.steps_per_epoch, self.global_batch, self.rows):
            raise DataPositionError(
                f"The checkpoint's data position is in epochs of {saved[0]} steps of {saved[1]} rows over "
                f"{saved[2]} rows of data, but this run's epochs have {self.steps_per_epoch} steps of "
                f"{self.global_batch} over {self.rows} (the data, sequence length or batch size changed): the "
                "position cannot be continued exactly. Resume with the data, SEQUENCE_LENGTH and "
                "BATCH_SIZE the run was saved with.")
        self.epoch, self.batches_in_epoch = int(state["epoch"]), int(state["batches_in_epoch"])
        self.end_of_epoch, self._ahead = False, None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        for task in self.plan.tasks:
            task.records.close()
