"""A damaged TFRecord found by the byte offset TensorFlow reports ("corrupted record at N"), which
names no file (the whole run: tests/cli/test_bad_input.py)."""

from __future__ import annotations

import re

import pytest

from t5x_lite.data.records import record_frame, tfrecord_stream
from t5x_lite.tf_setup import import_tensorflow


def _write(path, records) -> None:
    tf = import_tensorflow()
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)


def _tensorflow_complaint(path) -> str:
    tf = import_tensorflow()
    with pytest.raises(tf.errors.DataLossError) as e:
        list(tf.data.TFRecordDataset(str(path)).as_numpy_iterator())
    return e.value.message


@pytest.mark.parametrize("damage, problem", [
    (lambda data: data[:45] + bytes([data[45] ^ 1]) + data[46:], "bad data checksum in the record at byte 29"),
    (lambda data: data[:29] + b"\xff" + data[30:], "bad length checksum in the record at byte 29"),
    (lambda data: data[:-3], "ends inside the record at byte 58"),
])
def test_the_damaged_file_is_found_by_the_offset_tensorflow_reports(tmp_path, damage, problem):
    files = [tmp_path / f"shard-{i}.tfrecord" for i in range(3)]
    for path in files:
        _write(path, [b"x" * 13, b"y" * 13, b"z" * 13])  # records of 29 bytes: at 0, 29 and 58
    files[1].write_bytes(damage(files[1].read_bytes()))
    offset = int(re.search(r"(?:corrupted|truncated) record at (\d+)", _tensorflow_complaint(files[1])).group(1))
    assert tfrecord_stream.find_damaged([str(p) for p in files], offset) == (str(files[1]), problem)
    # Intact files, or an offset inside a record of them, are never blamed.
    assert tfrecord_stream.find_damaged([str(files[0]), str(files[2])], offset) is None
    assert tfrecord_stream.find_damaged([str(files[0])], 5) is None


def _frames(path) -> list:
    """Every frame of a file, walked as the readers walk it (stopping at the first damaged one)."""
    frames, offset = [], 0
    with open(path, "rb") as f:
        while (frame := record_frame.read_frame(f, offset)) is not None:
            frames.append(frame)
            if frame.damage is not None:
                break
            offset = frame.end
    return frames


def test_one_frame_reader_says_what_is_wrong_with_each_kind_of_damage(tmp_path):
    path = tmp_path / "r.tfrecord"
    _write(path, [b"", b"a", b"hello" * 100])
    data = path.read_bytes()
    assert [(f.offset, f.data, f.damage) for f in _frames(path)] == [
        (0, b"", None), (16, b"a", None), (33, b"hello" * 100, None)]
    damaged = {
        # the third frame starts at byte 33: its 8 length bytes, its length CRC, 500 bytes, the data CRC
        record_frame.Damage.TRUNCATED_HEADER: data[:40],
        record_frame.Damage.BAD_LENGTH_CRC: data[:41] + bytes([data[41] ^ 1]) + data[42:],
        record_frame.Damage.TRUNCATED_DATA: data[:-1],
        record_frame.Damage.BAD_DATA_CRC: data[:50] + bytes([data[50] ^ 1]) + data[51:],
    }
    for damage, corrupt in damaged.items():
        path.write_bytes(corrupt)
        last = _frames(path)[-1]
        assert (last.offset, last.damage, last.data) == (33, damage, None)
        assert (last.length is None) == damage.in_header
    with open(path, "rb") as f:  # the header alone: the data is neither read nor checked
        f.seek(33)
        assert record_frame.read_frame(f, 33, read_data=False) == record_frame.Frame(33, 500, None, None)
        assert f.tell() == 33 + record_frame.HEADER_BYTES
