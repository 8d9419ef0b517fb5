"""Language-modelling tasks over directories written by `t5x-lite prepare`.

A prepared directory holds `metadata.json`, `spm.model` and sharded TFRecords whose
`targets` feature is already tokenized, so reading needs no tokenizer. Long documents are
split into pieces that fit the sequence length (with room for EOS); the feature converter
then packs pieces into full rows.
"""

from __future__ import annotations

import functools
import json
import os

from t5x_lite.prepare import METADATA_FILE
from t5x_lite.tf_setup import import_tensorflow

tf = import_tensorflow()  # first, so that seqio and t5 find it quiet and off the GPUs

import seqio  # noqa: E402
from t5.data import preprocessors as t5_preprocessors  # noqa: E402


class TaskDataError(ValueError):
    """A task's data directory is missing, empty or malformed."""


def read_metadata(data_dir: str) -> dict:
    """The metadata.json of a prepared directory, with a clear error when it is absent."""
    path = os.path.join(data_dir, METADATA_FILE)
    if not tf.io.gfile.exists(path):
        raise TaskDataError(
            f"Data directory {data_dir!r} has no {METADATA_FILE}: it is missing or was never "
            f"prepared. Run `t5x-lite prepare --input=... --out={data_dir}` (or point the "
            "task's data_dir at a prepared directory)."
        )
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def _check_split_files(data_dir: str, metadata: dict) -> dict[str, str]:
    patterns = {}
    for split, info in metadata["splits"].items():
        pattern = os.path.join(data_dir, info["pattern"])
        if not tf.io.gfile.glob(pattern) or not info.get("num_examples"):
            raise TaskDataError(
                f"Split {split!r} of {data_dir!r} has no records (pattern {pattern!r}); "
                "re-run `t5x-lite prepare` on a non-empty input."
            )
        patterns[split] = pattern
    return patterns


@seqio.map_over_dataset
def targets_as_int32(example: dict) -> dict:
    """Prepared records store int64 ids; models and seqio's converters want int32."""
    return {"targets": tf.cast(example["targets"], tf.int32)}


def prepared_source(data_dir: str, *, extra_ids: int = 0) -> tuple[seqio.DataSource, seqio.Vocabulary]:
    """The token-id records of a prepared directory and its vocabulary (+ sentinel ids)."""
    metadata = read_metadata(data_dir)
    patterns = _check_split_files(data_dir, metadata)
    vocabulary = seqio.SentencePieceVocabulary(os.path.join(data_dir, metadata["vocabulary"]),
                                               extra_ids=extra_ids)
    source = seqio.TFExampleDataSource(
        split_to_filepattern=patterns,
        feature_description={"targets": tf.io.RaggedFeature(tf.int64)},
    )
    return source, vocabulary


def replace_task(name: str, **task_kwargs) -> seqio.Task:
    """Registers seqio task `name`, replacing an earlier registration of that name."""
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    return seqio.TaskRegistry.add(name, metric_fns=[], **task_kwargs)


def register_lm_task(name: str, data_dir: str) -> seqio.Task:
    """Registers (or re-registers) an LM task `name` over a prepared directory."""
    source, vocabulary = prepared_source(data_dir)
    return replace_task(
        name,
        source=source,
        preprocessors=[
            targets_as_int32,
            t5_preprocessors.split_tokens_to_targets_length,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features={"targets": seqio.Feature(vocabulary=vocabulary, add_eos=True)},
    )


@functools.cache
def _registered(name: str, data_dir: str) -> str:
    register_lm_task(name, data_dir)
    return name


def lm_task(*, name: str, data_dir: str) -> str:
    """Registers the LM task `name` over `data_dir` once and returns its name (for gin)."""
    return _registered(name, os.path.abspath(os.path.expanduser(data_dir)))
