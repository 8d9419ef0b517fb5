"""TFRecord files read through `t5x_lite.storage`, for stores tf.data cannot open (s3://).

Each file is streamed and its frames read and checked by data/records/record_frame.py (both checksums),
so a truncated or corrupted shard fails loudly instead of yielding bad examples.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from t5x_lite import storage
from t5x_lite.data.records.record_frame import HEADER_BYTES, read_frame
from t5x_lite.errors import UserError
from t5x_lite.tf_setup import import_tensorflow


class CorruptRecordError(UserError, ValueError):
    """A TFRecord file is truncated or fails its checksums."""


def iter_records(path: str) -> Iterator[bytes]:
    """The serialized records of the TFRecord file `path` (any `storage` path), in order."""
    with storage.open(path, "rb") as f:
        offset = 0
        while frame := read_frame(f, offset):
            if frame.damage is not None:
                raise CorruptRecordError(f"{path!r}: {frame.damage.value} at byte {offset}.")
            offset = frame.end
            yield frame.data


def find_damaged(paths: Sequence[str], offset: int) -> tuple[str, str] | None:
    """(path, what is wrong) of the first of `paths` whose record at byte `offset` is damaged.

    For TensorFlow's "corrupted record at N", which names no file: each file's record headers
    are walked (seeking past the data) up to N, which is where a record or its data starts, and
    only that record is read and checked.
    """
    for path in paths:
        try:
            problem = _damage_at(path, offset)
        except (OSError, storage.StorageError):
            continue
        if problem:
            return path, problem
    return None


def _damage_at(path: str, offset: int) -> str | None:
    """What is wrong with the record of `path` that starts (or whose data starts) at byte `offset`."""
    with storage.open(path, "rb") as f:
        position = 0
        while position <= offset:
            f.seek(position)
            at_it = offset in (position, position + HEADER_BYTES)
            frame = read_frame(f, position, read_data=at_it)
            if frame is None:
                return None
            if frame.damage is not None:
                return f"{frame.damage.value} at byte {position}" if at_it else None
            if at_it:
                return None
            position = frame.end
    return None


def _records_of(name: bytes) -> Iterator[bytes]:
    return iter_records(name.decode())


def record_dataset(filename):
    """A tf.data.Dataset of the serialized records of one file, given as a scalar string tensor.

    A drop-in for `tf.data.TFRecordDataset` as a seqio reader (`reader_cls`).
    """
    tf = import_tensorflow()
    return tf.data.Dataset.from_generator(_records_of, args=(filename,),
                                          output_signature=tf.TensorSpec([], tf.string))
