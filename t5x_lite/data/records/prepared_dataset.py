"""A prepared data directory's layout and its metadata.json, written and read back (its shards
are written by data/preparation/shards.py).

Layout: `spm.model`/`spm.vocab` (or, prepared with --tokenizer, a Hugging Face tokenizer in
`tokenizer/`), `<split>-SSSSS-of-NNNNN.tfrecord` (tf.train.Examples with `targets`, the token ids
without EOS, and `id`), each split's offset index `<split>.index.npy` (data/records/record_index.py),
and `metadata.json`, written last so that a directory holding it is complete (its `vocabulary`
names the vocabulary file; `tokenizer`, when present, the Hugging Face tokenizer's kind, source
and special ids).
"""

from __future__ import annotations

import json
import os

from t5x_lite import storage
from t5x_lite.data.records import record_index

FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
VOCAB_FILE = "spm.model"
TOKENIZER_SUBDIR = "tokenizer"  # a Hugging Face tokenizer's copy (prepare --tokenizer)
TMP_SUFFIX = ".tmp"  # a file's name while it is written


def read_metadata(data_dir: str) -> dict | None:
    """The metadata.json of a prepared directory (local, gs:// or s3://); None when it has none.

    A local directory is read without TensorFlow; storage.StorageError for an unreachable store.
    """
    path = storage.join(data_dir, METADATA_FILE)
    if not storage.is_url(data_dir):
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    if not storage.exists(path):
        return None
    with storage.open(path, "r") as f:
        return json.load(f)


def split_entry(directory: str, split: str, *, cached: bool = False) -> dict | None:
    """A split's entry (pattern, num_shards, num_examples, index): from a prepared directory's
    metadata.json, or from a task's offline cache (the `<split>.index.json` that `t5x-lite cache`
    writes beside the cached split, cached=True); None when there is none."""
    if not cached:
        return (read_metadata(directory) or {}).get("splits", {}).get(split)
    path = storage.join(directory, record_index.cached_entry_name(split))
    if not storage.exists(path):
        return None
    with storage.open(path, "r") as f:
        return json.load(f)


def write_metadata(out_dir: str, metadata: dict) -> None:
    """Writes `metadata` as the metadata.json of local `out_dir`, atomically (via a temporary name)."""
    path = os.path.join(out_dir, METADATA_FILE)
    with open(path + TMP_SUFFIX, "w", encoding="utf-8") as f:
        json.dump(metadata, f, indent=2)
        f.write("\n")
    os.replace(path + TMP_SUFFIX, path)
