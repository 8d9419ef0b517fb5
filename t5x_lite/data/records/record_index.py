"""The offset index of a prepared split: any record's bytes (and any token of the split) by number.

Format (written by `prepare`, or by `t5x-lite index` for a directory prepared before): beside a
split's TFRecord shards, `<split>.index.npy` holds one int64 row per record, in shard order
(every record of shard 0, then of shard 1, ...), plus a final row:

    column 0: the byte offset of the record's frame in its shard
    column 1: where the record starts in the split's token stream

The token stream is every record's `targets` followed by EOS (what an LM task reads), so record
r covers stream positions [index[r, 1], index[r + 1, 1]) and the final row holds the stream's
length. metadata.json's split entry gets `index`: the file, the records per shard and the stream
length. The records stay where they are, in TFRecord (read by the streaming path too); the
index adds 16 bytes per record. Reading checks each record's CRCs, as tf.data does, and parses
its `targets` with example_codec.py (no TensorFlow).
"""

from __future__ import annotations

import io
import os
import threading
from typing import Iterable, Sequence

import numpy as np

from t5x_lite import storage
from t5x_lite.data.records import example_codec, tfrecord_stream
from t5x_lite.data.records.record_frame import FRAME_BYTES, read_frame
from t5x_lite.data.records.tfrecord_stream import CorruptRecordError
from t5x_lite.errors import UserError

INDEX_FORMAT = "tfrecord-offsets-1"


class RecordIndexError(UserError, ValueError):
    """A split's index is missing, unreadable or does not match its shards."""


def index_file_name(split: str) -> str:
    return f"{split}.index.npy"


def cached_entry_name(split: str) -> str:
    """The JSON split entry (pattern, shards, index) `t5x-lite cache` writes beside a cached split."""
    return f"{split}.index.json"


def build_index(shard_records: Sequence[Sequence[int]], shard_lengths: Sequence[Sequence[int]]) -> np.ndarray:
    """The index rows of a split from each shard's record sizes (bytes) and token counts (without EOS)."""
    offsets, stream = [], []
    for sizes, lengths in zip(shard_records, shard_lengths):
        sizes = np.asarray(sizes, np.int64)
        offsets.append(np.concatenate([[0], np.cumsum(sizes + FRAME_BYTES)[:-1]]) if len(sizes) else sizes)
        stream.append(np.asarray(lengths, np.int64) + 1)
    stream_lengths = np.concatenate(stream) if stream else np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.cumsum(stream_lengths)])
    return np.stack([np.concatenate([*offsets, [0]]), starts], axis=1).astype(np.int64)


def write_index(out_dir: str, split: str, index: np.ndarray, records_per_shard: Sequence[int]) -> dict:
    """Writes `<split>.index.npy` into `out_dir` (via a temporary name); returns metadata's `index` entry."""
    path = storage.join(out_dir, index_file_name(split))
    buffer = io.BytesIO()
    np.save(buffer, index)
    if storage.is_url(out_dir):
        with storage.open(path, "wb") as f:
            f.write(buffer.getvalue())
    else:
        with open(path + ".tmp", "wb") as f:
            f.write(buffer.getvalue())
        os.replace(path + ".tmp", path)
    return {"format": INDEX_FORMAT, "file": index_file_name(split),
            "records_per_shard": list(map(int, records_per_shard)), "stream_tokens": int(index[-1, 1])}


def targets_lengths(records: list[bytes]) -> np.ndarray:
    """The number of `targets` ids of each serialized tf.train.Example."""
    return example_codec.int64_feature_sizes(records, "targets")


def parse_targets(records: list[bytes]) -> list[np.ndarray]:
    """Each serialized tf.train.Example's `targets` ids (example_codec.ExampleFormatError names a
    malformed record)."""
    return example_codec.int64_feature(records, "targets")


def index_shards(paths: Sequence[str], *, block: int = 1024) -> tuple[np.ndarray, list[int]]:
    """(index, records per shard) of existing TFRecord shards, read once (CRC-checked)."""
    sizes, lengths = [], []
    for path in paths:
        shard_sizes, shard_lengths, pending = [], [], []
        for record in tfrecord_stream.iter_records(path):
            shard_sizes.append(len(record))
            pending.append(record)
            if len(pending) == block:
                shard_lengths.extend(targets_lengths(pending))
                pending = []
        shard_lengths.extend(targets_lengths(pending))
        sizes.append(shard_sizes)
        lengths.append(shard_lengths)
    return build_index(sizes, lengths), [len(s) for s in sizes]


def shard_paths(data_dir: str, split_entry: dict) -> list[str]:
    """The paths of a split's TFRecord shards, in order, from its metadata entry (no listing)."""
    num_shards = int(split_entry["num_shards"])
    pattern = split_entry["pattern"].replace("*-of-*", "{:05d}-of-" + f"{num_shards:05d}")
    return [storage.join(data_dir, pattern.format(i)) for i in range(num_shards)]


class SplitRecords:
    """Random access to one split of a prepared directory through its index (any storage path).

    A local index is memory-mapped (no O(records) memory); a remote one is read whole.
    Thread-safe: each thread keeps its own open shard files.
    """

    def __init__(self, data_dir: str, split: str, split_entry: dict):
        entry = split_entry.get("index")
        if not entry or entry.get("format") != INDEX_FORMAT:
            raise RecordIndexError(f"Split {split!r} of {data_dir!r} has no index; write one with "
                              f"`t5x-lite index {data_dir}` (or read it by streaming: DataConfig.reader='stream').")
        self.data_dir, self.split = data_dir, split
        num_shards = int(split_entry["num_shards"])
        self.shard_paths = shard_paths(data_dir, split_entry)
        self.index = self._load(storage.join(data_dir, entry["file"]))
        counts = np.asarray(entry["records_per_shard"], np.int64)
        self.shard_starts = np.concatenate([[0], np.cumsum(counts)])
        if len(counts) != num_shards or len(self.index) != int(counts.sum()) + 1 or \
                int(self.index[-1, 1]) != int(entry["stream_tokens"]):
            raise RecordIndexError(f"The index of split {split!r} of {data_dir!r} does not match metadata.json "
                              f"(records or shards differ); write it again with `t5x-lite index {data_dir}`.")
        self.num_records = int(counts.sum())
        self.stream_tokens = int(entry["stream_tokens"])
        self._local = threading.local()

    def _load(self, path: str) -> np.ndarray:
        try:
            if storage.is_url(path):
                with storage.open(path, "rb") as f:
                    return np.load(io.BytesIO(f.read()))
            return np.load(path, mmap_mode="r")
        except (OSError, ValueError, storage.StorageError) as e:
            raise RecordIndexError(f"Cannot read the index {path!r} ({e}); write it again with "
                              f"`t5x-lite index {self.data_dir}`.") from None

    def records_covering(self, start: int, stop: int) -> range:
        """The records that hold stream positions [start, stop)."""
        starts = self.index[:, 1]
        first = int(np.searchsorted(starts, start, side="right")) - 1
        last = int(np.searchsorted(starts, stop - 1, side="right")) - 1
        return range(first, last + 1)

    def stream_start(self, record: int) -> int:
        return int(self.index[record, 1])

    def _file(self, shard: int):
        """This thread's open file of a local shard."""
        files = self._local.__dict__.setdefault("files", {})
        if shard not in files:
            files[shard] = open(self.shard_paths[shard], "rb")  # noqa: SIM115 - closed by close()
        return files[shard]

    def read(self, records: Iterable[int]) -> list[bytes]:
        """The serialized records, CRC-checked (CorruptRecordError names the file and byte). On an
        object store each record is one ranged request, all of them concurrent."""
        records = list(records)
        shards = [int(np.searchsorted(self.shard_starts, r, side="right")) - 1 for r in records]
        offsets = [int(self.index[r, 0]) for r in records]
        if self.shard_paths and storage.is_url(self.shard_paths[0]):
            # A record ends where the next one of its shard starts (the last one, at the file's end).
            ends = [int(self.index[r + 1, 0]) if r + 1 < self.shard_starts[s + 1] else None
                    for r, s in zip(records, shards)]
            paths = [self.shard_paths[s] for s in shards]
            sources = [io.BytesIO(b) for b in storage.read_ranges(paths, offsets, ends)]
        else:
            sources = [self._file(shard) for shard in shards]
        out = []
        for shard, offset, source in zip(shards, offsets, sources):
            source.seek(offset if isinstance(source, io.BufferedReader) else 0)
            frame = read_frame(source, offset)
            path = self.shard_paths[shard]
            if frame is None or frame.damage is not None and frame.damage.in_header:
                what = frame.damage.value if frame is not None else "the file ends before it"
                raise CorruptRecordError(f"{path!r}: no intact record at byte {offset}, where the index says one "
                                         f"starts ({what}); the shard changed after it was indexed: prepare the "
                                         f"data again or run `t5x-lite index {self.data_dir}`.")
            if frame.damage is not None:
                raise CorruptRecordError(f"{path!r}: the record at byte {offset} is damaged ({frame.damage.value}); "
                                         "prepare the data again or restore the file.")
            out.append(frame.data)
        return out

    def close(self) -> None:
        for f in self._local.__dict__.get("files", {}).values():
            f.close()
        self._local = threading.local()
