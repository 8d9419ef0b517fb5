"""`t5x-lite cache`: preprocess seqio tasks offline with Apache Beam (seqio's task caching).

Each split of each task runs through the task's preprocessors up to its
`seqio.CacheDatasetPlaceholder` once, in a Beam pipeline built from seqio's own transforms
(`seqio.beam_utils`), and lands in OUTPUT_CACHE_DIR/<task>/ in the layout that
`use_cached=True` reads: shuffled TFRecord shards, info and stats JSON per split, COMPLETED.
Each split then gets its offset index (data/records/record_index.py: `<split>.index.npy` and
`<split>.index.json`, the split entry the index path reads), so a cached LM task is read by
index like a prepared directory (data/indexed/index_plan.py).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, Sequence

from t5x_lite import storage
from t5x_lite.data import task_access
from t5x_lite.data.records import record_index
from t5x_lite.errors import UserError
from t5x_lite.tf_setup import import_tensorflow


class CacheError(UserError, ValueError):
    """The tasks or flags of `cache` cannot produce a cache; the message names the fix."""


def pipeline_options(beam_flags: Sequence[str]):
    """Beam PipelineOptions from command-line flags (DirectRunner unless --runner is given)."""
    from apache_beam.options.pipeline_options import PipelineOptions  # Beam is heavy and only `cache` needs it

    flags = list(beam_flags)
    if not any(flag.split("=", 1)[0] == "--runner" for flag in flags):
        flags.insert(0, "--runner=DirectRunner")
    options = PipelineOptions(flags)
    known = set(options.get_all_options())
    unknown = sorted(f"--{name}" for name in options.get_all_options(retain_unknown_options=True)
                     if name not in known)
    if unknown:
        raise CacheError(f"Unknown flags {unknown}: they are neither `cache` flags nor Beam "
                         "pipeline options. See `t5x-lite cache --help`.")
    return options


def _tasks_to_cache(names: Sequence[str]) -> list:
    """The registered tasks named (a mixture stands for its tasks), each checked to be cacheable."""

    tasks = {}
    for name in names:
        try:
            provider = task_access.get_task(name)
        except ValueError as e:
            raise CacheError(str(e)) from None
        for task in getattr(provider, "tasks", [provider]):
            if not task.supports_caching:
                raise CacheError(f"Task {task.name!r} cannot be cached: its preprocessors have no "
                                 "seqio.CacheDatasetPlaceholder() marking where the cache ends.")
            tasks[task.name] = task
    return list(tasks.values())


def _check_output_cache_dir(path: str) -> str:
    if storage.is_s3(path):
        raise CacheError(f"--output_cache_dir={path!r}: training reads caches through TensorFlow, "
                         "which has no s3 filesystem. Use a local directory or gs://.")
    return storage.absolute(path)


def _add_task(pipeline, task, output_dir: str, *, setup: Callable[[], None], min_shards: int,
              max_shards: int) -> None:
    """Adds the steps that cache each split of `task` in `output_dir`, as seqio's cache_tasks_main."""
    import apache_beam as beam  # Beam is heavy and only `cache` needs it
    import seqio  # seqio and TensorFlow load in seconds: imported where first needed
    from seqio import beam_utils  # seqio and TensorFlow load in seconds: imported where first needed

    written = []
    for split in task.splits:
        label = f"{task.name}_{split}"
        preprocess = beam_utils.PreprocessTask(task, split, setup_fn=setup)
        num_shards = max(len(preprocess.shards), min_shards)
        num_shards = min(num_shards, max_shards) if max_shards else num_shards
        # The reshuffle shuffles examples globally as a side effect: cached shards come out mixed.
        examples = (pipeline | f"{label}_pat" >> preprocess
                    | f"{label}_global_example_shuffle" >> beam.Reshuffle())
        written.append(examples | f"{label}_write_tfrecord" >> beam_utils.WriteExampleTfRecord(
            seqio.get_cached_tfrecord_prefix(output_dir, split), num_shards=num_shards))
        written.append(examples | f"{label}_info" >> beam_utils.GetInfo(num_shards)
                       | f"{label}_write_info" >> beam_utils.WriteJson(
                           seqio.get_cached_info_path(output_dir, split)))
        written.append(examples | f"{label}_stats" >> beam_utils.GetStats(task.output_features)
                       | f"{label}_write_stats" >> beam_utils.WriteJson(
                           seqio.get_cached_stats_path(output_dir, split)))
    # COMPLETED is written only after every split's outputs: seqio reads no cache without it.
    _ = (written
         | f"{task.name}_flatten_completion_values" >> beam.Flatten()
         | f"{task.name}_discard_completion_values" >> beam.Filter(lambda _: False)
         | f"{task.name}_write_completed_file" >> beam.io.textio.WriteToText(
             storage.join(output_dir, "COMPLETED"), append_trailing_newlines=False, num_shards=1,
             shard_name_template=""))


def cache_tasks(task_names: Sequence[str], output_cache_dir: str, *, registration: Callable[[], None],
                beam_flags: Sequence[str] = (), overwrite: bool = False, min_shards: int = 64,
                max_shards: int = 0, log: Callable[[str], None] = print) -> dict[str, str]:
    """Caches the registered tasks (or mixtures' tasks) named; returns {task: its cache dir}.

    A task already cached in `output_cache_dir` is skipped unless `overwrite`. Each split gets
    max(its source shards, `min_shards`) output shards, at most `max_shards` (0: no limit).
    """
    import apache_beam as beam  # Beam is heavy and only `cache` needs it
    import seqio  # seqio and TensorFlow load in seconds: imported where first needed

    gfile = import_tensorflow().io.gfile
    output_cache_dir = _check_output_cache_dir(output_cache_dir)
    if min_shards < 1 or max_shards < 0:
        raise CacheError("--min_shards must be positive and --max_shards at least 0 (no limit).")
    tasks = _tasks_to_cache(task_names)
    options = pipeline_options(beam_flags)
    seqio.add_global_cache_dirs([output_cache_dir])
    todo = {}
    for task in tasks:
        output_dir = storage.join(output_cache_dir, seqio.get_task_dir_from_name(task.name))
        if gfile.exists(storage.join(output_dir, "COMPLETED")) and not overwrite:
            log(f"{task.name}: already cached in {output_dir} (pass --overwrite to rebuild)")
            continue
        if gfile.exists(output_dir):  # an earlier, interrupted or overwritten cache
            gfile.rmtree(output_dir)
        todo[task.name] = (task, output_dir)
    if not todo:
        return {}
    setup = dataclasses.replace(registration, task_names=tuple(todo))
    gfile.makedirs(output_cache_dir)
    log(f"caching {', '.join(todo)} into {output_cache_dir} with the "
        f"{options.get_all_options()['runner']} ...")
    with beam.Pipeline(options=options) as pipeline:
        for task, output_dir in todo.values():
            _add_task(pipeline, task, output_dir, setup=setup, min_shards=min_shards,
                      max_shards=max_shards)
    for name, (task, output_dir) in todo.items():
        counts = {}
        for split in task.splits:
            with gfile.GFile(seqio.get_cached_stats_path(output_dir, split)) as f:
                counts[split] = json.load(f)["examples"]
            if "targets" in task.output_features:
                index_cached_split(output_dir, split)
        log(f"{name}: cached {counts} examples in {output_dir} (with offset indexes)")
    return {name: output_dir for name, (_, output_dir) in todo.items()}


def index_cached_split(output_dir: str, split: str) -> dict:
    """Writes the offset index of a cached split's shards; returns its split entry (as in a prepared
    directory's metadata.json: pattern, num_shards, num_examples, index)."""
    import seqio  # seqio and TensorFlow load in seconds: imported where first needed

    prefix = seqio.get_cached_tfrecord_prefix(output_dir, split)
    paths = sorted(storage.glob(f"{prefix}-*-of-*"))
    index, counts = record_index.index_shards(paths)
    entry = {"pattern": f"{prefix.rsplit('/', 1)[-1]}-*-of-*", "num_shards": len(paths),
             "num_examples": sum(counts), "index": record_index.write_index(output_dir, split, index, counts)}
    storage.write_whole(storage.join(output_dir, record_index.cached_entry_name(split)),
                        json.dumps(entry, indent=2) + "\n")
    return entry
