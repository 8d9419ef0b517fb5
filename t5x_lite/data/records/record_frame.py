"""One TFRecord frame: its layout and checksums, read from a file and checked, with what is wrong.

A TFRecord file is a sequence of frames:

    length       uint64, little-endian: the record's size in bytes
    length CRC   uint32: the masked CRC32C of those 8 bytes
    data         the record (`length` bytes)
    data CRC     uint32: the masked CRC32C of the data

`read_frame` reads one frame and says which check failed, if any (a `Damage`); each caller
words its own message (a streamed file, a damaged file found by offset, a record read by index).
`write_frame` writes one, as TensorFlow's TFRecordWriter does (uncompressed).
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from typing import BinaryIO

import google_crc32c

LENGTH = struct.Struct("<Q")
CRC = struct.Struct("<I")
HEADER_BYTES = LENGTH.size + CRC.size  # 12: the length and its CRC, before the data
FOOTER_BYTES = CRC.size  # 4: the data's CRC, after it
FRAME_BYTES = HEADER_BYTES + FOOTER_BYTES  # 16: a frame's size beyond its data
_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC32C rotated right by 15 bits plus a constant."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


class Damage(enum.Enum):
    """What is wrong with a frame, in the order the checks run; the value says it in words
    ("<file> ...", "... at byte N")."""

    TRUNCATED_HEADER = "ends inside a record header"
    BAD_LENGTH_CRC = "bad length checksum in the record"
    TRUNCATED_DATA = "ends inside the record"
    BAD_DATA_CRC = "bad data checksum in the record"

    @property
    def in_header(self) -> bool:
        """The length cannot be trusted, so the frame's end (and the next frame) is unknown."""
        return self in (Damage.TRUNCATED_HEADER, Damage.BAD_LENGTH_CRC)


@dataclasses.dataclass(frozen=True)
class Frame:
    """One frame read from `offset`: its data (None when not read or damaged), or its damage."""

    offset: int
    length: int | None  # the data's size; None when the header is damaged
    data: bytes | None
    damage: Damage | None

    @property
    def end(self) -> int:
        """Where the next frame starts (only for a frame whose header is intact)."""
        assert self.length is not None
        return self.offset + FRAME_BYTES + self.length


def write_frame(f: BinaryIO, data: bytes) -> int:
    """Writes `data` to `f` as one frame; returns the bytes written (FRAME_BYTES + len(data))."""
    length = LENGTH.pack(len(data))
    f.write(length + CRC.pack(masked_crc32c(length)))
    f.write(data)
    f.write(CRC.pack(masked_crc32c(data)))
    return FRAME_BYTES + len(data)


def read_frame(f: BinaryIO, offset: int, *, read_data: bool = True) -> Frame | None:
    """The frame that starts at the current position of `f`, which is byte `offset` of its file;
    None at the end of the file (no bytes left).

    With `read_data=False` only the header is read and checked, and `f` is left after it (walking
    a file's frames then seeks from `Frame.end` to the next without reading the data).
    """
    header = f.read(HEADER_BYTES)
    if not header:
        return None
    if len(header) < HEADER_BYTES:
        return Frame(offset, None, None, Damage.TRUNCATED_HEADER)
    (length,), (length_crc,) = LENGTH.unpack(header[:LENGTH.size]), CRC.unpack(header[LENGTH.size:])
    if masked_crc32c(header[:LENGTH.size]) != length_crc:
        return Frame(offset, None, None, Damage.BAD_LENGTH_CRC)
    if not read_data:
        return Frame(offset, length, None, None)
    body = f.read(length + FOOTER_BYTES)
    if len(body) < length + FOOTER_BYTES:
        return Frame(offset, length, None, Damage.TRUNCATED_DATA)
    data, (data_crc,) = body[:length], CRC.unpack(body[length:])
    if masked_crc32c(data) != data_crc:
        return Frame(offset, length, None, Damage.BAD_DATA_CRC)
    return Frame(offset, length, data, None)
