"""`t5x-lite index DATA_DIR`: writes the offset index of a directory prepared without one.

`prepare` writes each split's index itself; this converts a directory prepared before (local,
gs:// or s3://) by reading every shard once (CRC-checked) and writing `<split>.index.npy`, then
metadata.json with the splits' `index` entries (the shards are not touched). Run it once; a
training run then reads the directory by index (DataConfig.reader='auto').
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from t5x_lite import storage
from t5x_lite.data.records import prepared_dataset, record_index
from t5x_lite.errors import UserError


class IndexCommandError(UserError, ValueError):
    """The directory cannot be indexed (no metadata, no shards)."""


def index_directory(data_dir: str, *, log=print) -> dict:
    """Indexes every split of prepared directory `data_dir`; returns the updated metadata."""
    metadata = prepared_dataset.read_metadata(data_dir)
    if metadata is None:
        raise IndexCommandError(f"{data_dir!r} has no {prepared_dataset.METADATA_FILE}: it is not a prepared "
                                "directory (t5x-lite prepare writes one, with its index).")
    for split, entry in metadata["splits"].items():
        start = time.perf_counter()
        paths = sorted(storage.glob(storage.join(data_dir, entry["pattern"])))
        if len(paths) != int(entry["num_shards"]):
            raise IndexCommandError(f"Split {split!r} of {data_dir!r} has {len(paths)} shard files, but "
                                    f"metadata.json says {entry['num_shards']}; prepare the data again.")
        index, counts = record_index.index_shards(paths)
        if sum(counts) != int(entry["num_examples"]):
            raise IndexCommandError(f"Split {split!r} of {data_dir!r} holds {sum(counts)} records, but "
                                    f"metadata.json says {entry['num_examples']}; prepare the data again.")
        entry["index"] = record_index.write_index(data_dir, split, index, counts)
        log(f"{split}: {sum(counts):,} records, {entry['index']['stream_tokens']:,} stream tokens indexed in "
            f"{time.perf_counter() - start:.1f} s")
    if storage.is_url(data_dir):
        storage.write_whole(storage.join(data_dir, prepared_dataset.METADATA_FILE),
                            json.dumps(metadata, indent=2) + "\n")
    else:
        prepared_dataset.write_metadata(data_dir, metadata)
    return metadata


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="t5x-lite index", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_dir", help="a directory written by `t5x-lite prepare` (local, gs:// or s3://)")
    args = parser.parse_args(argv)
    try:
        index_directory(args.data_dir)
    except (UserError, storage.StorageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
