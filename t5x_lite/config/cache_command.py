"""`t5x-lite cache`: the tasks a run's gin config names (or --tasks), cached by data/preparation/cache.py's Beam pipeline."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
from typing import Sequence

import gin

from t5x_lite import errors, host_memory
from t5x_lite.config import parsing, registry
from t5x_lite.data import task_access, task_modules
from t5x_lite.data.preparation import cache

USAGE = """t5x-lite cache --output_cache_dir=DIR [--tasks=NAME,...] [flags] [Beam flags]
           (--gin_file=FILE [--gin.KEY=VALUE ...] | --module=MODULE)"""


EPILOG = """\
Tasks are registered as for training: by the gin files' task factories (MIXTURE_OR_TASK_NAME =
@lm_task(), ...) and MIXTURE_OR_TASK_MODULE, and by the modules named with --module. Gin
flags are those of `t5x-lite train` (--gin_file, --gin.KEY=VALUE, --gin_search_paths).

Reading the cache in a run (the same gin flags, plus):
  --gin.USE_CACHED_TASKS=True --seqio_additional_cache_dirs=DIR   (any task; t5x's flag)
  --gin.USE_CACHED_TASKS=True --gin.lm_task.cache_dir="'DIR'"     (an lm_task)

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

        for module in self.modules:
            task_modules.import_task_module(module)
        if not self.gin_config:
            return []
        registry.register_configurables()
        gin.clear_config()
        gin.parse_config(self.gin_config)
        task_module = _macro_value("MIXTURE_OR_TASK_MODULE")
        if task_module:
            task_modules.import_task_module(task_module)
        name = _macro_value("MIXTURE_OR_TASK_NAME")
        return [name] if name else []

    def __call__(self) -> None:
        """Beam's setup hook: registers the tasks in a worker process that lacks them."""
        with _REGISTRATION_LOCK:
            import seqio  # seqio and TensorFlow load in seconds: only Beam workers need it here

            if not set(self.task_names) <= set(seqio.TaskRegistry.names()):
                self.register()
                for name in self.task_names:  # a prepared task enters seqio's registry when asked for
                    task_access.get_task(name)


def _macro_value(name: str):
    """The value of gin macro `name` (None when unbound), evaluating `@factory()` references."""

    try:
        value = gin.query_parameter(f"%{name}")
    except ValueError:
        return None
    if isinstance(value, gin.config.ConfigurableReference):
        return value.scoped_configurable_fn() if value.evaluate else value.scoped_configurable_fn
    return value


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
        gin_files, bindings, search_paths, rest = parsing.split_gin_flags(argv)
        args, beam_flags = _parser().parse_known_args(rest)
        try:
            gin_config = ""
            if gin_files or bindings:
                parsing.parse(gin_files=gin_files, gin_bindings=bindings, gin_search_paths=search_paths)
                gin_config = gin.config_str()
            registration = Registration(gin_config=gin_config, modules=tuple(args.modules))
            configured = registration.register()
            task_names = args.tasks or configured
            if not task_names:
                raise cache.CacheError("Name the tasks to cache with --tasks=NAME[,NAME...], or give the "
                                 "gin files of a run (their MIXTURE_OR_TASK_NAME is cached).")
            cache.cache_tasks(task_names, args.output_cache_dir, registration=registration,
                        beam_flags=beam_flags, overwrite=args.overwrite, min_shards=args.min_shards,
                        max_shards=args.max_shards)
        except cache.CacheError as e:
            print(f"error: {e}", file=sys.stderr)
            return errors.EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    host_memory.run_program(main)
