"""tf.train.Example records and TFRecord frames written and read without TensorFlow, checked against
TensorFlow's own writer and parser; and `prepare` where TensorFlow cannot be imported."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from t5x_lite.data.records import example_codec, record_frame, record_index
from t5x_lite.data.records.example_codec import ExampleFormatError
from t5x_lite.errors import UserError
from tests.cli.test_without_tensorflow import BLOCKED, blocking_packages
from tests.cli_helpers import ROOT, cli_env
from tests.data.test_prepare import make_corpus

EDGE_IDS = [0, 1, 127, 128, 255, 16383, 16384, 2**31, 2**62, 2**63 - 1, -1, -128, -2**63]


def tf_example(features: dict) -> tf.train.Example:
    """A tf.train.Example of int64 (ints), float (floats) or bytes lists."""
    def feature(values):
        if values and isinstance(values[0], bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        if values and isinstance(values[0], float):
            return tf.train.Feature(float_list=tf.train.FloatList(value=values))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    return tf.train.Example(features=tf.train.Features(feature={k: feature(v) for k, v in features.items()}))


def tf_parse(records: list[bytes], name: str) -> list[list[int]]:
    parsed = tf.io.parse_example(records, {name: tf.io.RaggedFeature(tf.int64)})[name]
    return parsed.to_list()


def varint(n: int) -> bytes:
    """A protobuf varint, written here apart from the codec's own."""
    n &= 2**64 - 1
    out = b""
    while True:
        out += bytes([n & 0x7F | (0x80 if n >= 0x80 else 0)])
        n >>= 7
        if not n:
            return out


def delimited(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def example_bytes(entries: list[tuple[bytes, bytes]]) -> bytes:
    """An Example whose feature map holds (key, Feature bytes) entries in the order given."""
    return delimited(1, b"".join(delimited(1, delimited(1, key) + delimited(2, feature)) for key, feature in entries))


def int64_list(values: list[int], *, packed: bool = True) -> bytes:
    """A Feature holding an Int64List, its values packed or one field each."""
    if packed:
        return delimited(3, delimited(1, b"".join(map(varint, values))))
    return delimited(3, b"".join(b"\x08" + varint(v) for v in values))


# ------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("features", [  # a few values and many, small and large (each way of encoding)
    {"targets": EDGE_IDS, "id": [7]},
    {"targets": list(range(300)), "id": [0]},
    {"targets": EDGE_IDS * 30, "id": [2**40]},
    {"targets": list(range(0, 2**20, 997)), "id": [-3]},
    {"targets": [5] * 20 + [70000], "id": [70000]},
    {"targets": [], "id": [3]},
    {"zeta": [5], "alpha": [b"text", b""], "mid": [-5, 40000], "empty": []},
])
def test_our_encoding_is_tensorflows_and_parses_to_the_same_values(features):
    ours = example_codec.encode_example(features)
    assert ours == tf_example(features).SerializeToString(deterministic=True)
    for name, values in features.items():
        if not values or isinstance(values[0], int):
            assert tf_parse([ours], name) == [values]
            assert example_codec.int64_feature([ours], name)[0].tolist() == values


def test_numpy_ids_encode_as_lists_do():
    ids = [3, 20000, -1, 2**40]
    assert (example_codec.encode_example({"targets": np.asarray(ids)})
            == example_codec.encode_example({"targets": ids}))


def test_tensorflow_examples_decode_to_their_ids_in_any_feature_order():
    targets = {"targets": EDGE_IDS, "id": [11], "text": [b"abc"], "score": [0.5, 2.0]}
    one = tf_example(targets).SerializeToString()
    # The map's entries in other orders: concatenated messages merge, so each feature may come
    # first or last, and the Features field may come more than once.
    parts = {k: tf_example({k: v}).SerializeToString() for k, v in targets.items()}
    reversed_order = b"".join(parts[k] for k in reversed(list(parts)))
    targets_first = parts["targets"] + parts["score"] + parts["text"] + parts["id"]
    no_targets_values = tf_example({"targets": [], "id": [1]}).SerializeToString()
    records = [one, reversed_order, targets_first, no_targets_values]
    expected = [EDGE_IDS, EDGE_IDS, EDGE_IDS, []]
    assert tf_parse(records, "targets") == expected
    decoded = example_codec.int64_feature(records, "targets")
    assert [d.tolist() for d in decoded] == expected
    assert all(d.dtype == np.int64 for d in decoded)
    assert example_codec.int64_feature_sizes(records, "targets").tolist() == [len(e) for e in expected]
    assert [d.tolist() for d in example_codec.int64_feature(records, "id")] == [[11], [11], [11], [1]]
    assert example_codec.int64_feature([], "targets") == []


def test_unpacked_values_and_a_later_entry_of_the_same_key_are_read_as_protobuf_reads_them():
    unpacked = example_bytes([(b"targets", int64_list(EDGE_IDS, packed=False))])
    repeated_key = example_bytes([(b"targets", int64_list([9])), (b"id", int64_list([1])),
                                  (b"targets", int64_list([4, 5]))])
    # A packed run and single values in one list add up (protobuf's rule; tf.io.parse_example
    # stops after the packed run).
    mixed = example_bytes([(b"targets", delimited(3, delimited(1, varint(1) + varint(2)) + b"\x08" + varint(300)))])
    records = [unpacked, repeated_key, mixed]
    expected = [list(tf.train.Example.FromString(r).features.feature["targets"].int64_list.value) for r in records]
    assert expected == [EDGE_IDS, [4, 5], [1, 2, 300]]
    assert tf_parse(records[:2], "targets") == expected[:2]
    assert [d.tolist() for d in example_codec.int64_feature(records, "targets")] == expected
    assert example_codec.int64_feature_sizes(records, "targets").tolist() == [len(e) for e in expected]


def test_record_index_parses_targets_with_the_codec():
    records = [example_codec.encode_example({"targets": list(range(n)), "id": [n]}) for n in (0, 5, 200)]
    assert [t.tolist() for t in record_index.parse_targets(records)] == [[], list(range(5)), list(range(200))]
    assert record_index.targets_lengths(records).tolist() == [0, 5, 200]


def test_frames_we_write_are_tensorflows_and_read_back_by_both(tmp_path):
    records = [b"", b"x", example_codec.encode_example({"targets": EDGE_IDS}), bytes(range(256)) * 40]
    ours, theirs = tmp_path / "ours.tfrecord", tmp_path / "theirs.tfrecord"
    with open(ours, "wb") as f:
        sizes = [record_frame.write_frame(f, record) for record in records]
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for record in records:
            writer.write(record)
    assert ours.read_bytes() == theirs.read_bytes()
    assert sizes == [len(r) + record_frame.FRAME_BYTES for r in records]
    assert list(tf.data.TFRecordDataset(str(ours)).as_numpy_iterator()) == records
    read, offset = [], 0
    with open(ours, "rb") as f:
        while (frame := record_frame.read_frame(f, offset)) is not None:
            assert frame.damage is None
            read.append(frame.data)
            offset = frame.end
    assert read == records


# ------------------------------------------------------------------------------------ damaged input

GOOD = example_codec.encode_example({"targets": [1, 300, 70000], "id": [4]})


@pytest.mark.parametrize("record, problem", [
    (GOOD[:-3], r"field 1 runs past the end of its message"),
    (GOOD[:1], r"a varint runs past the end of its message"),
    (example_codec.encode_example({"id": [4]}), r"no feature 'targets'"),
    (example_codec.encode_example({"targets": [b"ab"]}), r"feature 'targets' is a bytes_list, not an int64_list"),
    (example_bytes([(b"targets", delimited(2, delimited(1, b"\0\0\0\0")))]), r"is a float_list"),
    (example_bytes([(b"targets", delimited(3, delimited(1, b"\x05\x80")))]), r"end inside a varint"),
    (example_bytes([(b"targets", delimited(3, delimited(1, b"\xff" * 10 + b"\x01")))]), r"longer than 10 bytes"),
    (example_bytes([(b"targets", delimited(3, b"\x08" + b"\xff" * 11))]), r"varint longer than 10 bytes"),
    (b"\x0f" + GOOD, r"field 1 has wire type 7"),
])
def test_damaged_records_raise_an_error_naming_the_record_and_the_fault(record, problem):
    with pytest.raises(ExampleFormatError, match=rf"^Example record 1 \(of 3\): .*{problem}"):
        example_codec.int64_feature([GOOD, record, GOOD], "targets")
    if "longer than 10 bytes" not in problem:  # counting reads the messages, not the values
        with pytest.raises(ExampleFormatError, match=rf"^Example record 1 \(of 3\): .*{problem}"):
            example_codec.int64_feature_sizes([GOOD, record, GOOD], "targets")


def test_values_that_are_not_int64_are_refused_when_writing():
    assert issubclass(ExampleFormatError, UserError)
    for values in ([2**64], ["a"], [2**63]):
        with pytest.raises(ExampleFormatError, match="Cannot write .* as int64 values"):
            example_codec.encode_example({"targets": values})


# ------------------------------------------------------------------------------------ prepare without TensorFlow


def test_prepare_runs_where_tensorflow_cannot_be_imported_and_its_index_matches_the_records(tmp_path):
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    documents = make_corpus(corpus)
    env = cli_env(extra_pythonpath=str(blocking_packages(tmp_path / "blocked")))
    for name in BLOCKED:
        probe = subprocess.run([sys.executable, "-c", f"import {name}"], env=env, capture_output=True, text=True)
        assert probe.returncode != 0 and "is not installed here" in probe.stderr
    done = subprocess.run([sys.executable, "-m", "t5x_lite.cli", "prepare", f"--input={corpus}", f"--out={out}",
                           "--vocab_size=320", "--num_shards=3", "--validation_fraction=0.2", "--num_workers=1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    metadata = json.loads((out / "metadata.json").read_text())
    ids = []
    for split, entry in metadata["splits"].items():
        shards = sorted(out.glob(f"{split}-*-of-*.tfrecord"))
        assert len(shards) == entry["num_shards"]
        offsets, lengths, records = [], [], []
        for path in shards:  # read by TensorFlow, apart from the index and its reader
            shard_records = list(tf.data.TFRecordDataset(str(path)).as_numpy_iterator())
            sizes = [len(r) + record_frame.FRAME_BYTES for r in shard_records]
            offsets.extend(np.cumsum([0, *sizes[:-1]]).tolist())
            lengths.extend(len(t) for t in tf_parse(shard_records, "targets"))
            ids.extend(i[0] for i in tf_parse(shard_records, "id"))
            records.extend(shard_records)
        index = np.load(out / entry["index"]["file"])
        assert index[:-1, 0].tolist() == offsets
        assert np.diff(index[:, 1]).tolist() == [n + 1 for n in lengths]  # each record's targets and EOS
        assert entry["index"]["records_per_shard"] == [len(list(tf.data.TFRecordDataset(str(p)))) for p in shards]
        assert entry["num_examples"] == len(records) and entry["num_tokens"] == sum(lengths)
        split_records = record_index.SplitRecords(str(out), split, entry)
        assert split_records.read(range(split_records.num_records)) == records
    assert sorted(ids) == list(range(len(documents)))
