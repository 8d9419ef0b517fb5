"""tf.train.Example records in protobuf's wire format, written and read without TensorFlow.

The messages (tensorflow/core/example/{example,feature}.proto), by field number:

    Example   { 1: Features features }
    Features  { 1: map<string, Feature> feature }   each entry { 1: key, 2: value }
    Feature   { oneof: 1: BytesList, 2: FloatList, 3: Int64List }
    BytesList { 1: repeated bytes }     Int64List { 1: repeated int64, packed }

`encode_example` writes int64 and bytes lists, the map in key order: the bytes of TensorFlow's
`SerializeToString(deterministic=True)`. `int64_feature` reads one int64 feature of many records:
the messages are walked in Python, and the values of a block of records are decoded at once
with numpy; `int64_feature_sizes` counts them. Values may be packed (as written here and by
TensorFlow) or one field each (as other writers may emit). Malformed input raises
`ExampleFormatError`, naming the record and the fault.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from t5x_lite.errors import UserError

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5  # protobuf wire types
_FEATURE_KINDS = {1: "bytes_list", 2: "float_list", 3: "int64_list"}
_MAX_VARINT_BYTES = 10  # 64 bits in 7-bit groups
_DECODE_BLOCK_BYTES = 1 << 17  # varints decoded at once (their arrays stay in the CPU's caches)
_FEW_VALUES, _FEW_LARGE_VALUES = 256, 16  # fewer values (of 2**14 and more) are encoded in Python
_CONTINUED = bytes(range(0x80, 0x100))  # the bytes of a varint that another byte follows


class ExampleFormatError(UserError, ValueError):
    """A serialized tf.train.Example is malformed or lacks the feature asked for (or holds another
    kind of list there); or values to write are not int64."""


# ------------------------------------------------------------------------------------ writing


def _varint(n: int) -> bytes:
    """One non-negative integer as a protobuf varint (sizes and tags)."""
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _two_complement(value: int) -> int:
    """An int64 value as the uint64 of the same bits."""
    if not -(1 << 63) <= value < 1 << 63:
        raise OverflowError(f"{value} is not an int64")
    return value & 0xFFFF_FFFF_FFFF_FFFF


@functools.cache
def _short_varints() -> list[bytes]:
    """The varint of every value below 2**14 (one or two bytes), by value: most token ids."""
    return [_varint(n) for n in range(1 << 14)]


def _varints(values: Sequence[int] | np.ndarray) -> bytes:
    """int64 values as consecutive varints (negative ones in 10 bytes, as two's complement). A few
    values are encoded in Python (numpy's cost per call would outweigh its speed), small ones
    looked up; more with numpy."""
    if len(values) < _FEW_VALUES:
        values = values.tolist() if isinstance(values, np.ndarray) else values
        if 0 <= min(values) and max(values) < 1 << 14:
            return b"".join(map(_short_varints().__getitem__, values))
        if len(values) < _FEW_LARGE_VALUES:  # a document's id, say
            return b"".join(_varint(_two_complement(v)) for v in values)
    rest = np.asarray(values, np.int64).view(np.uint64)
    shifts = np.arange(max(1, -(-int(rest.max()).bit_length() // 7)), dtype=np.uint64) * np.uint64(7)
    groups = rest[:, None] >> shifts  # each value's 7-bit groups, low first, and what lies above
    present = groups != 0
    present[:, 0] = True
    more = np.zeros_like(present)  # the continuation bit: another group follows
    more[:, :-1] = present[:, 1:]
    return ((groups & 0x7F) | (more.astype(np.uint64) << 7)).astype(np.uint8)[present].tobytes()


def _delimited(number: int, payload: bytes) -> bytes:
    """A length-delimited field: tag, size, bytes."""
    return _varint(number << 3 | LEN) + _varint(len(payload)) + payload


def _feature(values: Sequence[int] | Sequence[bytes] | np.ndarray) -> bytes:
    """A Feature holding `values`: a BytesList for bytes, else an Int64List (empty: an Int64List)."""
    if len(values) and isinstance(values[0], (bytes, bytearray)):
        return _delimited(1, b"".join(_delimited(1, bytes(v)) for v in values))
    try:
        if isinstance(values, np.ndarray) and values.dtype.kind not in "iu":
            raise TypeError(f"an array of {values.dtype}")
        packed = _varints(values) if len(values) else b""
    except (OverflowError, TypeError, ValueError) as e:
        raise ExampleFormatError(f"Cannot write {values[:8]!r} as int64 values ({e}).") from None
    return _delimited(3, _delimited(1, packed) if packed else b"")


def encode_example(features: Mapping[str, Sequence[int] | Sequence[bytes] | np.ndarray]) -> bytes:
    """A serialized tf.train.Example of int64 (or bytes) list features, keys in sorted order."""
    entries = (_delimited(1, _delimited(1, key.encode()) + _delimited(2, _feature(features[key])))
               for key in sorted(features))
    return _delimited(1, b"".join(entries))


# ------------------------------------------------------------------------------------ reading


def _read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """(the varint at `pos`, the position after it), within data[:end]."""
    value = shift = 0
    while shift < 7 * _MAX_VARINT_BYTES:
        if pos >= end:
            raise ExampleFormatError(f"a varint runs past the end of its message at byte {pos}")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ExampleFormatError(f"a varint longer than {_MAX_VARINT_BYTES} bytes ends at byte {pos}")


def _next_field(data: bytes, pos: int, end: int) -> tuple[int, int, int, int]:
    """(field number, wire type, start, stop) of the field at `pos` of a message that ends at `end`;
    data[start:stop] holds a length-delimited field's payload, a varint's or a fixed field's bytes,
    and the next field starts at `stop`."""
    tag = data[pos]
    tag, pos = (tag, pos + 1) if tag < 0x80 else _read_varint(data, pos, end)  # one byte: the usual
    wire = tag & 7
    if wire == LEN:
        size = data[pos] if pos < end else 0x80
        if size < 0x80:  # sizes of one and two bytes read here: the usual
            start = pos + 1
        elif pos + 1 < end and data[pos + 1] < 0x80:
            size, start = size & 0x7F | data[pos + 1] << 7, pos + 2
        else:
            size, start = _read_varint(data, pos, end)
        stop = start + size
    elif wire == VARINT:
        start, (_, stop) = pos, _read_varint(data, pos, end)
    elif wire in (FIXED64, FIXED32):
        start, stop = pos, pos + (8 if wire == FIXED64 else 4)
    else:
        raise ExampleFormatError(f"field {tag >> 3} has wire type {wire}, which no Example holds (at byte {pos})")
    if stop > end:
        raise ExampleFormatError(f"field {tag >> 3} runs past the end of its message (byte {end})")
    return tag >> 3, wire, start, stop


def _feature_span(record: bytes, key: bytes) -> tuple[int, int] | None:
    """Where the Feature of `key` lies in `record` (the last entry of that key), or None.

    Fields other than those read are skipped, as protobuf does; a second Features adds its entries.
    """
    found, at, end = None, 0, len(record)
    while at < end:  # the Example's fields
        number, wire, features, at = _next_field(record, at, end)
        if number != 1 or wire != LEN:
            continue
        features_end = at
        while features < features_end:  # the map's entries
            number, wire, entry, features = _next_field(record, features, features_end)
            if number != 1 or wire != LEN:
                continue
            entry_end = features
            entry_key, value = b"", (entry_end, entry_end)  # an absent value is an empty Feature
            while entry < entry_end:  # the entry's key and value
                number, wire, start, entry = _next_field(record, entry, entry_end)
                if wire == LEN and number == 1:
                    entry_key = record[start:entry]
                elif wire == LEN and number == 2:
                    value = (start, entry)
            if entry_key == key:
                found = value
    return found


def _int64_chunks(record: bytes, name: str) -> list[bytes]:
    """The raw varints of the int64 feature `name` of one record (packed runs and single values)."""
    span = _feature_span(record, name.encode())
    if span is None:
        raise ExampleFormatError(f"no feature {name!r}")
    kind, chunks = None, []
    at, end = span
    while at < end:  # the Feature's fields: its kind (a oneof: the last one set wins)
        number, wire, values, at = _next_field(record, at, end)
        if wire != LEN or number not in _FEATURE_KINDS:
            continue
        if number != kind:
            kind, chunks = number, []
        while number == 3 and values < at:  # an Int64List (a second one adds its values)
            field, wire, start, values = _next_field(record, values, at)
            if field == 1 and wire == LEN and start < values and record[values - 1] >= 0x80:
                raise ExampleFormatError(f"feature {name!r}: its packed values end inside a varint (byte {values})")
            if field == 1 and wire in (LEN, VARINT):
                chunks.append(record[start:values])
    if kind not in (None, 3):
        raise ExampleFormatError(f"feature {name!r} is a {_FEATURE_KINDS[kind]}, not an int64_list")
    return chunks


def _longest_varint(buf: np.ndarray) -> int:
    """The size in bytes of the longest varint in `buf` (uint8): its longest run of bytes with the
    continuation bit, plus one; counted up to one more than a varint may have."""
    run, longest = buf >= 0x80, 1  # run: where `longest` bytes with the continuation bit start
    while longest <= _MAX_VARINT_BYTES and run.any():
        longest += 1
        run = run[:-1] & (buf[longest - 1:] >= 0x80)
    return longest


def _decode_varints(buf: np.ndarray, ends: np.ndarray, longest: int) -> np.ndarray:
    """The int64 values of the consecutive varints that fill `buf` (uint8), given the byte each
    ends at and the size of the longest (at most 10 bytes)."""
    # At each byte, the value of the varint that ends there, from its last (highest) 7-bit group
    # down: one lower group a pass. uint64 keeps the one bit of a 10th group (a negative value).
    values = (buf & 0x7F).astype(np.uint16 if longest <= 2 else np.uint32 if longest <= 4 else np.uint64)
    within = np.ones(len(buf), np.uint8)
    for back in range(1, longest):
        within = within[1:] & (buf[:-back] >> 7)  # byte i - back belongs to the varint ending at byte i
        values[back:] <<= within * np.uint8(7)
        values[back:] |= buf[:-back] & (within * np.uint8(0x7F))
    return values[ends].view(np.int64) if values.dtype == np.uint64 else values[ends].astype(np.int64)


def _in_record(i: int, total: int, what: str) -> ExampleFormatError:
    return ExampleFormatError(f"Example record {i} (of {total}): {what}.")


def _records_chunks(records: Sequence[bytes], name: str) -> Iterator[list[bytes]]:
    """Each record's raw varints of the int64 feature `name` (ExampleFormatError names the record)."""
    for i, record in enumerate(records):
        try:
            yield _int64_chunks(record, name)
        except ExampleFormatError as e:
            raise _in_record(i, len(records), str(e)) from None


def _decode_block(block: list[list[bytes]], *, name: str, first: int, total: int) -> list[np.ndarray]:
    """The values of consecutive records (each its raw varints), records first..first+len-1 of `total`."""
    record_ends = np.cumsum([sum(map(len, chunks)) for chunks in block])
    buf = np.frombuffer(b"".join(chunk for chunks in block for chunk in chunks), np.uint8)
    ends = np.flatnonzero(buf < 0x80)
    longest = _longest_varint(buf)
    if longest > _MAX_VARINT_BYTES:
        sizes = np.diff(ends, prepend=-1)
        i = first + int(np.searchsorted(record_ends, ends[np.argmax(sizes > _MAX_VARINT_BYTES)], side="right"))
        raise _in_record(i, total, f"feature {name!r} holds a varint longer than {_MAX_VARINT_BYTES} bytes")
    values = _decode_varints(buf, ends, longest)
    bounds = [0, *np.searchsorted(ends, record_ends).tolist()]  # each record's first value, and the end
    return [values[start:stop] for start, stop in zip(bounds[:-1], bounds[1:])]


def int64_feature(records: Sequence[bytes], name: str) -> list[np.ndarray]:
    """The int64 feature `name` of each serialized tf.train.Example in `records` (int64 arrays;
    empty where the feature holds no values). ExampleFormatError names a malformed record.

    The values are decoded a block of records at a time (about _DECODE_BLOCK_BYTES of varints):
    the arrays of a block stay in the CPU's caches while they are worked on.
    """
    values: list[np.ndarray] = []
    block, block_bytes = [], 0
    for i, chunks in enumerate(_records_chunks(records, name)):
        block.append(chunks)
        block_bytes += sum(map(len, chunks))
        if block_bytes >= _DECODE_BLOCK_BYTES or i == len(records) - 1:
            values.extend(_decode_block(block, name=name, first=i + 1 - len(block), total=len(records)))
            block, block_bytes = [], 0
    return values


def int64_feature_sizes(records: Sequence[bytes], name: str) -> np.ndarray:
    """The number of values of the int64 feature `name` of each record: its varints are counted
    (their last bytes), not decoded."""
    return np.fromiter((sum(len(chunk.translate(None, _CONTINUED)) for chunk in chunks)
                        for chunks in _records_chunks(records, name)), np.int64, len(records))
