"""TFRecord files read through `t5x_lite.storage`, for stores tf.data cannot open (s3://).

Each file is streamed and its framing parsed here: a little-endian uint64 length, the masked
CRC32C of those 8 bytes, the record, and the masked CRC32C of the record. Both checksums are
verified, so a truncated or corrupted shard fails loudly instead of yielding bad examples.
"""

from __future__ import annotations

import struct
from typing import Iterator, Sequence

import google_crc32c

from t5x_lite import storage
from t5x_lite.errors import UserError
from t5x_lite.tf_setup import import_tensorflow

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8


class CorruptRecordError(UserError, ValueError):
    """A TFRecord file is truncated or fails its checksums."""


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC32C rotated right by 15 bits plus a constant."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def iter_records(path: str) -> Iterator[bytes]:
    """The serialized records of the TFRecord file `path` (any `storage` path), in order."""
    with storage.open(path, "rb") as f:
        offset = 0
        while header := f.read(_LENGTH.size + _CRC.size):
            if len(header) < _LENGTH.size + _CRC.size:
                raise CorruptRecordError(f"{path!r} ends inside a record header at byte {offset}.")
            (length,), (length_crc,) = _LENGTH.unpack(header[:8]), _CRC.unpack(header[8:])
            if masked_crc32c(header[:8]) != length_crc:
                raise CorruptRecordError(f"{path!r}: bad length checksum at byte {offset}.")
            data, footer = f.read(length), f.read(_CRC.size)
            if len(data) < length or len(footer) < _CRC.size:
                raise CorruptRecordError(f"{path!r} ends inside the record at byte {offset}.")
            if masked_crc32c(data) != _CRC.unpack(footer)[0]:
                raise CorruptRecordError(f"{path!r}: bad data checksum in the record at byte {offset}.")
            offset += len(header) + length + _CRC.size
            yield data


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
    header_size = _LENGTH.size + _CRC.size
    with storage.open(path, "rb") as f:
        position = 0
        while position <= offset:
            f.seek(position)
            header = f.read(header_size)
            at_it = offset in (position, position + header_size)
            if len(header) < header_size:
                return f"ends inside a record header at byte {position}" if at_it and header else None
            (length,), (length_crc,) = _LENGTH.unpack(header[:8]), _CRC.unpack(header[8:])
            if masked_crc32c(header[:8]) != length_crc:
                return f"bad length checksum in the record at byte {position}" if at_it else None
            if at_it:
                data, footer = f.read(length), f.read(_CRC.size)
                if len(data) < length or len(footer) < _CRC.size:
                    return f"ends inside the record at byte {position}"
                if masked_crc32c(data) != _CRC.unpack(footer)[0]:
                    return f"bad data checksum in the record at byte {position}"
                return None
            position += header_size + length + _CRC.size
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
