"""`t5x-lite cache`: preprocess seqio tasks offline with Apache Beam (seqio's task caching).

Each split of each task runs through the task's preprocessors up to its
`seqio.CacheDatasetPlaceholder` once, in a Beam pipeline built from seqio's own transforms
(`seqio.beam_utils`), and lands in OUTPUT_CACHE_DIR/<task>/ in the layout that
`use_cached=True` reads: shuffled TFRecord shards, info and stats JSON per split, COMPLETED.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
from typing import Callable, Sequence

from t5x_lite import errors, storage
from t5x_lite.tf_setup import import_tensorflow

USAGE = """t5x-lite cache --output_cache_dir=DIR [--tasks=NAME,...] [flags] [Beam flags]
           (--gin_file=FILE [--gin.KEY=VALUE ...] | --module=MODULE)"""

EPILOG = """\
Tasks are registered as for training: by the gin files' task factories (MIXTURE_OR_TASK_NAME =
@lm_task(), ...) and MIXTURE_OR_TASK_MODULE, and by the modules named with --module. Gin
flags are those of `t5x-lite train` (--gin_file, --gin.KEY=VALUE, --gin_search_paths).

Reading the cache in a run (the same gin flags, plus):
  --gin.lm_task.cache_dir="'DIR'" --gin.train/DataConfig.use_cached=True

Beam pipeline flags (any apache_beam PipelineOptions flag; the default is --runner=DirectRunner):
  all local cores   --direct_num_workers=0 --direct_running_mode=multi_processing
  Dataflow          --runner=DataflowRunner --project=PROJECT --region=REGION
                    --temp_location=gs://BUCKET/tmp --sdk_container_image=IMAGE
  Spark             --runner=SparkRunner --spark_master_url=spark://HOST:7077
                    --environment_type=DOCKER --environment_config=IMAGE
  Flink             --runner=FlinkRunner --flink_master=HOST:8081
                    --environment_type=DOCKER --environment_config=IMAGE
On a cluster, IMAGE is a container with requirements/lock.txt and t5x_lite installed, the
task's data_dir is a gs:// or s3:// path the workers can read, and --output_cache_dir is gs://
(training reads caches through TensorFlow, which has no s3). Beam writes gs:// and submits to
Dataflow only with its gcp extra: pip install 'apache-beam[gcp]==2.77.0' where you launch.

Example:
  t5x-lite cache --gin_file=runs/quickstart.gin --output_cache_dir=data/cache \\
    --min_shards=8 --direct_num_workers=0 --direct_running_mode=multi_processing
"""

_REGISTRATION_LOCK = threading.Lock()


class CacheError(ValueError):
    """The tasks or flags of `cache` cannot produce a cache; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Registration:
    """How the tasks to cache get registered: a picklable recipe that Beam workers repeat.

    Attributes:
      task_names: the tasks that must be registered afterwards.
      gin_config: the parsed gin config as text ('' for none); its MIXTURE_OR_TASK_NAME is
        evaluated, which calls the task factories, and its MIXTURE_OR_TASK_MODULE imported.
      modules: modules whose import registers tasks.
    """

    task_names: tuple[str, ...] = ()
    gin_config: str = ""
    modules: tuple[str, ...] = ()

    def register(self) -> list[str]:
        """Registers the tasks; returns the gin config's task or mixture name (or nothing)."""
        import gin

        from t5x_lite import config, loops

        for module in self.modules:
            loops.import_task_module(module)
        if not self.gin_config:
            return []
        config.register_configurables()
        gin.clear_config()
        gin.parse_config(self.gin_config)
        task_module = _macro_value("MIXTURE_OR_TASK_MODULE")
        if task_module:
            loops.import_task_module(task_module)
        name = _macro_value("MIXTURE_OR_TASK_NAME")
        return [name] if name else []

    def __call__(self) -> None:
        """Beam's setup hook: registers the tasks in a worker process that lacks them."""
        import seqio

        with _REGISTRATION_LOCK:
            if not set(self.task_names) <= set(seqio.TaskRegistry.names()):
                self.register()


def _macro_value(name: str):
    """The value of gin macro `name` (None when unbound), evaluating `@factory()` references."""
    import gin

    try:
        value = gin.query_parameter(f"%{name}")
    except ValueError:
        return None
    if isinstance(value, gin.config.ConfigurableReference):
        return value.scoped_configurable_fn() if value.evaluate else value.scoped_configurable_fn
    return value


def pipeline_options(beam_flags: Sequence[str]):
    """Beam PipelineOptions from command-line flags (DirectRunner unless --runner is given)."""
    from apache_beam.options.pipeline_options import PipelineOptions

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
    from t5x_lite import data

    tasks = {}
    for name in names:
        try:
            provider = data.get_task(name)
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


def _add_task(pipeline, task, output_dir: str, *, setup: Registration, min_shards: int,
              max_shards: int) -> None:
    """Adds the steps that cache each split of `task` in `output_dir`, as seqio's cache_tasks_main."""
    import apache_beam as beam
    import seqio
    from seqio import beam_utils

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


def cache_tasks(task_names: Sequence[str], output_cache_dir: str, *, registration: Registration,
                beam_flags: Sequence[str] = (), overwrite: bool = False, min_shards: int = 64,
                max_shards: int = 0, log: Callable[[str], None] = print) -> dict[str, str]:
    """Caches the registered tasks (or mixtures' tasks) named; returns {task: its cache dir}.

    A task already cached in `output_cache_dir` is skipped unless `overwrite`. Each split gets
    max(its source shards, `min_shards`) output shards, at most `max_shards` (0: no limit).
    """
    import apache_beam as beam
    import seqio

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
        log(f"{name}: cached {counts} examples in {output_dir}")
    return {name: output_dir for name, (_, output_dir) in todo.items()}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t5x-lite cache", usage=USAGE, epilog=EPILOG,
                                description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_cache_dir", required=True,
                   help="directory to write the caches to (local or gs://)")
    p.add_argument("--tasks", type=lambda s: [n for n in s.split(",") if n], default=[],
                   help="comma-separated task or mixture names "
                        "(default: the gin files' MIXTURE_OR_TASK_NAME)")
    p.add_argument("--module", action="append", default=[], dest="modules",
                   help="module to import that registers tasks (repeatable)")
    p.add_argument("--overwrite", action="store_true", help="rebuild caches that already exist")
    p.add_argument("--min_shards", type=int, default=64,
                   help="fewest output shards per split; more shards shuffle better (default 64)")
    p.add_argument("--max_shards", type=int, default=0,
                   help="most output shards per split (0: no limit)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command line for `cache`; returns 2 (after printing why) on bad flags, tasks or data."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        _parser().print_help()
        return 0
    with errors.reported():
        import gin

        from t5x_lite import config

        gin_files, bindings, search_paths, rest = config.split_gin_flags(argv)
        args, beam_flags = _parser().parse_known_args(rest)
        try:
            gin_config = ""
            if gin_files or bindings:
                config.parse(gin_files=gin_files, gin_bindings=bindings, gin_search_paths=search_paths)
                gin_config = gin.config_str()
            registration = Registration(gin_config=gin_config, modules=tuple(args.modules))
            configured = registration.register()
            task_names = args.tasks or configured
            if not task_names:
                raise CacheError("Name the tasks to cache with --tasks=NAME[,NAME...], or give the "
                                 "gin files of a run (their MIXTURE_OR_TASK_NAME is cached).")
            cache_tasks(task_names, args.output_cache_dir, registration=registration,
                        beam_flags=beam_flags, overwrite=args.overwrite, min_shards=args.min_shards,
                        max_shards=args.max_shards)
        except CacheError as e:
            print(f"error: {e}", file=sys.stderr)
            return errors.EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
