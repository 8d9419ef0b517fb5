"""A prepared directory's sharded TFRecords, written round-robin in document order, and the
outputs of an earlier run cleared.

Records are encoded by data/records/example_codec.py and framed by data/records/record_frame.py
(no TensorFlow). Shards are written under temporary names and renamed only once every shard is
finished, so an interrupted run leaves no shard that looks whole (the layout:
data/records/prepared_dataset.py).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import shutil
from collections.abc import Iterable, Sequence

import numpy as np

from t5x_lite.data.preparation.corpus import SPLITS, Document, split_of
from t5x_lite.data.records import example_codec, record_index
from t5x_lite.data.records.prepared_dataset import METADATA_FILE, TMP_SUFFIX, TOKENIZER_SUBDIR
from t5x_lite.data.records.record_frame import write_frame

_WRITE_BUFFER = 1 << 20  # bytes buffered per open shard


@functools.cache
def shard_paths(out_dir: str, split: str, num_shards: int) -> list[str]:
    """`<out_dir>/<split>-SSSSS-of-NNNNN.tfrecord` for each shard."""
    return [os.path.join(out_dir, f"{split}-{i:05d}-of-{num_shards:05d}.tfrecord")
            for i in range(num_shards)]


class _SplitWriter:
    """Writes one split round-robin over its shards, under temporary names until `commit`."""

    def __init__(self, paths: list[str]):
        self._paths = paths
        self._files = [open(path + TMP_SUFFIX, "wb", buffering=_WRITE_BUFFER) for path in paths]  # noqa: SIM115
        self.num_examples = 0
        self.num_tokens = 0
        # Each shard's record sizes and token counts, for the split's offset index.
        self.record_sizes: list[list[int]] = [[] for _ in paths]
        self.record_tokens: list[list[int]] = [[] for _ in paths]

    def write(self, document_id: int, ids: Sequence[int] | np.ndarray) -> None:
        # The feature map in key order: the same bytes in every process (and as TensorFlow's
        # deterministic serialization).
        record = example_codec.encode_example({"targets": ids, "id": [document_id]})
        shard = self.num_examples % len(self._files)
        write_frame(self._files[shard], record)
        self.record_sizes[shard].append(len(record))
        self.record_tokens[shard].append(len(ids))
        self.num_examples += 1
        self.num_tokens += len(ids)

    def close(self) -> None:
        for f in self._files:
            f.close()

    def commit(self) -> None:
        """Gives the finished shards their final names."""
        for path in self._paths:
            os.replace(path + TMP_SUFFIX, path)

    def discard(self) -> None:
        """Closes and deletes the unfinished shards."""
        self.close()
        for path in self._paths:
            if os.path.exists(path + TMP_SUFFIX):
                os.remove(path + TMP_SUFFIX)


def write_shards(encoded: Iterable[tuple[Document, Sequence[int] | np.ndarray]], *, out_dir: str,
                 num_shards: dict[str, int], seed: int,
                 validation_fraction: float) -> dict[str, dict]:
    """Writes each split's records round-robin in document order, and its offset index
    (record_index.py); returns each split's counts and index entry.

    Shards appear under their final names only once every shard is complete.
    """
    writers = {split: _SplitWriter(shard_paths(out_dir, split, num_shards[split]))
               for split in SPLITS}
    try:
        for document, ids in encoded:
            split = split_of(document.key, seed=seed, validation_fraction=validation_fraction)
            writers[split].write(document.id, ids)
        for writer in writers.values():
            writer.close()
    except BaseException:
        for writer in writers.values():
            writer.discard()
        raise
    for writer in writers.values():
        writer.commit()
    return {split: {"pattern": f"{split}-*-of-*.tfrecord", "num_shards": num_shards[split],
                    "num_examples": writer.num_examples, "num_tokens": writer.num_tokens,
                    "index": record_index.write_index(
                        out_dir, split, record_index.build_index(writer.record_sizes, writer.record_tokens),
                        [len(sizes) for sizes in writer.record_sizes])}
            for split, writer in writers.items()}


# -------------------------------------------------------------- an earlier run's outputs


def is_output(name: str) -> bool:
    """Whether file `name` is the metadata or a shard of a prepared directory."""
    return name == METADATA_FILE or any(fnmatch.fnmatch(name, f"{split}-*-of-*.tfrecord*")
                                        or name.startswith(record_index.index_file_name(split))
                                        for split in SPLITS)


def clear_outputs(out_dir: str) -> None:
    """Removes the metadata, shards and tokenizer copy of an earlier (possibly interrupted) run in `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(out_dir)):  # metadata.json sorts before the shards
        if is_output(name):
            os.remove(os.path.join(out_dir, name))
    shutil.rmtree(os.path.join(out_dir, TOKENIZER_SUBDIR), ignore_errors=True)
