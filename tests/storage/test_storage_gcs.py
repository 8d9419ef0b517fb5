"""gs:// paths against a real GCS emulator (tests/gcs_emulator.py): the storage functions,
`prepare --out=gs://...`, reading by index with ranged reads, and the errors for a missing bucket
or missing credentials."""

import pytest

from t5x_lite import storage
from t5x_lite.data.preparation import corpus, prepare
from tests.gcs_emulator import BUCKET
from tests.storage.test_storage_s3 import assert_same_files, assert_same_indexed_batches, prepare_small


@pytest.fixture(scope="module")
def gcs_data_dir(gcs_server, small_data_dir):
    return prepare_small(f"gs://{BUCKET}/small")


def test_storage_functions_on_gcs(gcs_server, tmp_path):
    base = f"gs://{BUCKET}/storage"
    storage.makedirs(base)
    with storage.open(f"{base}/a.txt", "w") as f:
        f.write("text")
    with storage.open(f"{base}/sub/b.bin", "wb") as f:
        f.write(bytes(range(256)) * 4)
    assert storage.exists(f"{base}/a.txt") and storage.exists(f"{base}/sub")
    assert not storage.exists(f"{base}/missing") and not storage.exists(f"gs://{BUCKET}-missing/x")
    assert storage.glob(f"{base}/*.txt") == [f"{base}/a.txt"]
    assert storage.listdir(base) == ["a.txt", "sub"]
    assert storage.walk_files(base) == [f"{base}/a.txt", f"{base}/sub/b.bin"]
    with storage.open(f"{base}/a.txt", "r") as f:
        assert f.read() == "text"
    with storage.open(f"{base}/sub/b.bin", "rb") as f:  # a ranged read
        f.seek(300)
        assert f.read(4) == bytes([44, 45, 46, 47])
    local_copy = tmp_path / "ranges.bin"
    local_copy.write_bytes(bytes(range(256)) * 4)
    for path in (f"{base}/sub/b.bin", str(local_copy)):  # concurrent ranged requests; the same locally
        assert storage.read_ranges([path, path], [300, 1020], [304, None]) == [bytes([44, 45, 46, 47]),
                                                                               bytes([252, 253, 254, 255])]

    storage.write_whole(f"{base}/whole.txt", "all at once")
    storage.rename(f"{base}/sub", f"{base}/moved")
    assert storage.listdir(base) == ["a.txt", "moved", "whole.txt"]
    local = tmp_path / "b.bin"
    storage.copy(f"{base}/moved/b.bin", str(local))
    assert local.read_bytes() == bytes(range(256)) * 4
    storage.remove(f"{base}/a.txt")
    storage.remove_tree(f"{base}/moved")
    assert storage.listdir(base) == ["whole.txt"]


def test_prepare_to_gcs_uploads_the_same_files(gcs_data_dir, small_data_dir):
    assert_same_files(gcs_data_dir, small_data_dir)


def test_prepare_refuses_a_missing_bucket_or_a_prepared_prefix(gcs_data_dir, small_data_dir):
    with pytest.raises(corpus.PrepareError, match=f"Bucket gs://{BUCKET}-missing .* does not exist"):
        prepare.prepare(inputs=[str(small_data_dir)], out_dir=f"gs://{BUCKET}-missing/x")
    with pytest.raises(corpus.PrepareError, match="already holds a prepared dataset"):
        prepare.prepare(inputs=[str(small_data_dir)], out_dir=gcs_data_dir)


def test_reading_by_index_over_gcs_gives_the_local_batches(gcs_data_dir, small_data_dir):
    assert_same_indexed_batches(gcs_data_dir, str(small_data_dir))


def test_a_missing_bucket_is_one_line_naming_it(gcs_server):
    with pytest.raises(storage.StorageError, match=f"Bucket gs://{BUCKET}-missing of .* does not exist"):
        storage.check_bucket(f"gs://{BUCKET}-missing/run")
    storage.check_bucket(f"gs://{BUCKET}/run")  # an existing bucket, an absent prefix: fine


def test_missing_credentials_are_one_line_naming_the_fix(monkeypatch, tmp_path):
    """No emulator and no usable application default credentials: no silent anonymous access."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    with pytest.raises(storage.StorageError, match="no Google Cloud credentials .*GOOGLE_APPLICATION_CREDENTIALS"):
        storage.exists("gs://some-bucket/run")
