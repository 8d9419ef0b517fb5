"""Language-modelling tasks over directories written by `t5x-lite prepare`.

A prepared directory holds `metadata.json`, `spm.model` (or, prepared with --tokenizer, a
Hugging Face tokenizer in tokenizer/) and sharded TFRecords whose `targets` feature is already
tokenized, so reading needs no tokenizer. Long documents are
split into pieces that fit the sequence length (with room for EOS); the feature converter
then packs pieces into full rows.
"""

from __future__ import annotations

from t5x_lite import storage
from t5x_lite.data import task_registry
from t5x_lite.data.indexed import index_plan
from t5x_lite.data.records import tfrecord_stream
from t5x_lite.data.vocab import hf_vocabulary, seqio_vocabularies
from t5x_lite.errors import TaskDataError
from t5x_lite.tf_setup import import_tensorflow

tf = import_tensorflow()  # first, so that seqio and t5 find it quiet and off the GPUs

import seqio  # noqa: E402
from t5.data import preprocessors as t5_preprocessors  # noqa: E402


def _check_split_files(data_dir: str, metadata: dict) -> dict[str, list[str]]:
    """Each split's shard files, listed here because seqio globs through tf.io.gfile (no s3)."""
    files = {}
    for split, info in metadata["splits"].items():
        pattern = storage.join(data_dir, info["pattern"])
        files[split] = storage.glob(pattern)
        if not files[split] or not info.get("num_examples"):
            raise TaskDataError(
                f"Split {split!r} of {data_dir!r} has no records (pattern {pattern!r}); "
                "re-run `t5x-lite prepare` on a non-empty input."
            )
    return files


@seqio.map_over_dataset
def targets_as_int32(example: dict) -> dict:
    """Prepared records store int64 ids; models and seqio's converters want int32."""
    return {"targets": tf.cast(example["targets"], tf.int32)}


def prepared_source(data_dir: str, *, extra_ids: int = 0) -> tuple[seqio.DataSource, seqio.Vocabulary]:
    """The token-id records of a prepared directory and its vocabulary (+ sentinel ids).

    `data_dir` may be local, gs:// or s3://. tf.data reads local and gs:// shards itself;
    s3:// shards are streamed through fsspec (t5x_lite.data.records.tfrecord_stream). Either way seqio
    shards by file, so each host opens only its own shards.
    """
    metadata = task_registry.read_metadata(data_dir)
    files = _check_split_files(data_dir, metadata)
    s3 = storage.is_s3(data_dir)
    # spm.model with seqio's ids, or (prepared with --tokenizer) a Hugging Face tokenizer with its own
    vocabulary = seqio_vocabularies.as_seqio(hf_vocabulary.prepared_vocabulary(data_dir, metadata, extra_ids=extra_ids))
    source = seqio.TFExampleDataSource(
        split_to_filepattern=files,
        feature_description={"targets": tf.io.RaggedFeature(tf.int64)},
        reader_cls=tfrecord_stream.record_dataset if s3 else tf.data.TFRecordDataset,
    )
    return source, vocabulary


class TaskWithCacheHint(seqio.Task):
    """A seqio.Task whose missing offline cache is reported with the command that builds it."""

    def assert_cached(self) -> None:
        if not self.cache_dir:
            searched = seqio.get_global_cache_dirs()
            where = f"searched {searched}" if searched else "no cache directory is set"
            raise TaskDataError(
                f"Task {self.name!r} has no offline cache (use_cached=True; {where}). "
                f"Build it with `t5x-lite cache --tasks={self.name} --output_cache_dir=DIR` plus "
                "the --gin_file/--gin.X flags of the run, then name DIR with "
                "--gin.lm_task.cache_dir=\"'DIR'\" (or read uncached: DataConfig.use_cached=False)."
            )


def replace_task(name: str, **task_kwargs) -> seqio.Task:
    """Registers seqio task `name`, replacing an earlier registration of that name."""
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    return seqio.TaskRegistry.add(name, task_cls=TaskWithCacheHint, metric_fns=[], **task_kwargs)


def register_prepared_task(name: str, data_dir: str, *, preprocessors: list, features: tuple[str, ...],
                           extra_ids: int = 0) -> seqio.Task:
    """Registers (or re-registers) task `name`: a prepared directory's records as int32 ids, then
    `preprocessors`; each of `features` uses the directory's vocabulary (+ `extra_ids`) with EOS."""
    source, vocabulary = prepared_source(data_dir, extra_ids=extra_ids)
    return replace_task(
        name,
        source=source,
        preprocessors=[targets_as_int32, *preprocessors],
        output_features={k: seqio.Feature(vocabulary=vocabulary, add_eos=True) for k in features},
    )


def register_lm_task(name: str, data_dir: str) -> seqio.Task:
    """Registers (or re-registers) an LM task `name` over a prepared directory (readable by index:
    its rows are the directory's documents + EOS, packed; data/indexed/index_plan.py)."""
    task = register_prepared_task(
        name, data_dir, features=("targets",),
        preprocessors=[
            # `t5x-lite cache` stores the records up to here; splitting depends on the length.
            seqio.CacheDatasetPlaceholder(),
            t5_preprocessors.split_tokens_to_targets_length,
            seqio.preprocessors.append_eos_after_trim,
        ],
    )
    index_plan.register_lm_task(name, task, data_dir)
    return task


def lm_task(*, name: str, data_dir: str, cache_dir: str | None = None) -> seqio.Task:
    """Registers the seqio LM task `name` over `data_dir` (an absolute path or URL) and returns it.

    `cache_dir` (the --output_cache_dir of `t5x-lite cache`) is added to seqio's cache
    directories, where `DataConfig.use_cached=True` looks for the task's offline cache.
    """
    if cache_dir:
        seqio.add_global_cache_dirs([storage.absolute(cache_dir)])
    return register_lm_task(name, data_dir)
