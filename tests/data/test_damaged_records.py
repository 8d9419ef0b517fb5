"""A damaged TFRecord found by the byte offset TensorFlow reports ("corrupted record at N"), which
names no file (the whole run: tests/cli/test_bad_input.py)."""

from __future__ import annotations

import re

import pytest

from t5x_lite.data import tfrecord_stream
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
