"""s3:// paths: the storage functions, `prepare --out=s3://...` and LM tasks over s3, against moto's S3 server."""

import struct

import numpy as np
import pytest

from t5x_lite import storage
from t5x_lite.data.preparation import corpus, prepare
from t5x_lite.data.records import tfrecord_stream
from t5x_lite.tf_setup import import_tensorflow
from tests.cli_helpers import VALIDATION_FRACTION
from tests.conftest import S3_BUCKET as BUCKET


def prepare_small(out: str) -> str:
    """`small_data_dir`'s inputs and options, prepared straight to `out` (an object store)."""
    import sysconfig
    from pathlib import Path

    prepare.prepare(inputs=[str(Path(sysconfig.get_paths()["stdlib"]) / "json")], out_dir=out,
                    vocab_size=512, num_shards=2, validation_fraction=VALIDATION_FRACTION, num_workers=2,
                    log=lambda _: None)
    return out


def assert_same_files(remote: str, local_dir) -> None:
    names = sorted(p.name for p in local_dir.iterdir())
    assert storage.listdir(remote) == names
    for name in names:
        with storage.open(f"{remote}/{name}", "rb") as f:
            assert f.read() == (local_dir / name).read_bytes(), name


def assert_same_indexed_batches(remote: str, local: str) -> None:
    """Reading by index from `remote` (each record a ranged read, CRC-checked) gives `local`'s batches."""
    from t5x_lite.data import task_access, task_factories
    from t5x_lite.data.indexed import index_plan, indexed_input

    batches = []
    for data_dir in (remote, local):
        name = f"test_indexed_{abs(hash(data_dir))}"
        plan, why = index_plan.plan(task_access.DataConfig(task_factories.lm_task(name=name, data_dir=data_dir),
                                                           sequence_length=64, batch_size=4))
        assert plan is not None, why
        iterator = indexed_input.IndexedBatchIterator(plan, num_epochs=1, host_batch_size=4)
        batches.append([next(iterator) for _ in range(3)])
        iterator.close()
    for remote_batch, local_batch in zip(*batches):
        for key in local_batch:
            np.testing.assert_array_equal(remote_batch[key], local_batch[key])


@pytest.fixture(scope="module")
def s3_data_dir(s3_server, small_data_dir):
    return prepare_small(f"s3://{BUCKET}/small")


def test_storage_functions_on_s3(s3_server, tmp_path):

    base = f"s3://{BUCKET}/storage"
    storage.makedirs(base)
    with storage.open(f"{base}/a.txt", "w") as f:
        f.write("text")
    with storage.open(f"{base}/sub/b.bin", "wb") as f:
        f.write(b"\x00\x01")
    assert storage.exists(f"{base}/a.txt") and storage.exists(f"{base}/sub")
    assert not storage.exists(f"{base}/missing") and not storage.exists("s3://no-such-bucket/x")
    assert storage.glob(f"{base}/*.txt") == [f"{base}/a.txt"]
    assert storage.listdir(base) == ["a.txt", "sub"]
    with storage.open(f"{base}/a.txt", "r") as f:
        assert f.read() == "text"

    local = tmp_path / "b.bin"
    storage.copy(f"{base}/sub/b.bin", str(local))
    assert local.read_bytes() == b"\x00\x01"
    copy = storage.tensorflow_readable(f"{base}/sub/b.bin")
    assert copy != f"{base}/sub/b.bin" and open(copy, "rb").read() == b"\x00\x01"

    storage.remove(f"{base}/a.txt")
    assert storage.listdir(base) == ["sub"]


def test_prepare_to_s3_uploads_the_same_files(s3_data_dir, small_data_dir):
    assert_same_files(s3_data_dir, small_data_dir)


def test_prepare_refuses_a_missing_bucket_or_a_prepared_prefix(s3_data_dir, small_data_dir):

    with pytest.raises(corpus.PrepareError, match="Bucket s3://no-such-bucket .* does not exist"):
        prepare.prepare(inputs=[str(small_data_dir)], out_dir="s3://no-such-bucket/x")
    with pytest.raises(corpus.PrepareError, match="already holds a prepared dataset"):
        prepare.prepare(inputs=[str(small_data_dir)], out_dir=s3_data_dir)


def _examples(name, split, shard_info=None):
    import seqio

    dataset = seqio.get_mixture_or_task(name).get_dataset(
        {"targets": 64}, split=split, shuffle=False, shard_info=shard_info)
    return [ex["targets"].tolist() for ex in dataset.as_numpy_iterator()]


def test_lm_task_over_s3_reads_what_the_local_directory_holds(s3_data_dir, small_data_dir):
    import seqio

    from t5x_lite.data.tasks import lm

    remote = lm.lm_task(name="test_s3_small_lm", data_dir=s3_data_dir).name
    local = lm.lm_task(name="test_local_small_lm", data_dir=str(small_data_dir)).name
    vocabulary = seqio.get_mixture_or_task(remote).output_features["targets"].vocabulary
    assert vocabulary.vocab_size == 512 and vocabulary.decode([300, 301])
    for split in ("train", "validation"):
        examples = _examples(remote, split)
        assert examples and examples == _examples(local, split)
    # Sharded by file: each host opens only its own shards.
    for index in range(2):
        shard = seqio.ShardInfo(index=index, num_shards=2)
        assert _examples(remote, "train", shard) == _examples(local, "train", shard)


def test_reading_by_index_over_s3_gives_the_local_batches(s3_data_dir, small_data_dir):
    assert_same_indexed_batches(s3_data_dir, str(small_data_dir))


@pytest.mark.parametrize("data_dir", [f"s3://{BUCKET}/no-such-prefix", "s3://no-such-bucket/small"])
def test_missing_s3_data_names_the_path(s3_server, data_dir):
    from t5x_lite.data.tasks import lm

    with pytest.raises(lm.TaskDataError, match=f"{data_dir}' has no metadata.json"):
        lm.lm_task(name="test_s3_missing", data_dir=data_dir)


def test_record_stream_matches_tensorflow_and_checks_crcs(tmp_path):
    tf = import_tensorflow()
    path = str(tmp_path / "r.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in (b"", b"a", b"hello" * 1000):
            writer.write(record)
    expected = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    assert list(tfrecord_stream.iter_records(path)) == expected
    assert list(tfrecord_stream.record_dataset(tf.constant(path)).as_numpy_iterator()) == expected

    data = (tmp_path / "r.tfrecord").read_bytes()
    bad_length_crc = data[:8] + struct.pack("<I", 0) + data[12:]
    flipped = data[:-5] + bytes([data[-5] ^ 1]) + data[-4:]
    for name, corrupt, message in [("length", bad_length_crc, "bad length checksum"),
                                   ("data", flipped, "bad data checksum"),
                                   ("truncated", data[:-10], "ends inside the record")]:
        (tmp_path / name).write_bytes(corrupt)
        with pytest.raises(tfrecord_stream.CorruptRecordError, match=message):
            list(tfrecord_stream.iter_records(str(tmp_path / name)))


def test_an_s3_endpoint_that_does_not_answer_is_one_storage_error_naming_it(monkeypatch):
    import s3fs

    # Nothing listens on port 9 of the loopback; one attempt, so the test does not wait for retries.
    for key, value in {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1",
                       "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        with pytest.raises(storage.StorageError, match=r"Cannot reach 's3://bucket/run': the S3 endpoint "
                                                       r"http://127.0.0.1:9 does not answer"):
            storage.exists("s3://bucket/run")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
