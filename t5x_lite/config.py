"""Gin configuration: T5X-style flags, search paths, and the registry of configurables.

Flags (same as t5x): `--gin_file=FILE` (repeatable, applied in order), `--gin.KEY=VALUE`
(a binding, applied after all files), `--gin_search_paths=DIR[,DIR...]`. Files are looked up
in the search paths, then the current directory, then the project's own gin/ folder, which
is found both in a checkout and in an installed package.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import re
from pathlib import Path
from typing import Sequence

import gin


class ConfigError(ValueError):
    """A gin file or binding is invalid; the message names the file, line or binding."""


def builtin_gin_dir() -> Path:
    """gin/ of a checkout, or the copy shipped inside the installed package."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "gin", here / "gin_configs"):
        if candidate.is_dir():
            return candidate
    raise ConfigError(f"The gin/ folder was not found beside {here}; reinstall t5x_lite.")


def lm_task(*, name: str, data_dir: str, cache_dir: str | None = None) -> str:
    """Registers the LM task `name` over a prepared data directory and returns the name.

    Args:
      name: the seqio task name to register.
      data_dir: a directory written by `t5x-lite prepare` (local, gs:// or s3://).
      cache_dir: where `t5x-lite cache` wrote offline caches (its --output_cache_dir), read
        when DataConfig.use_cached is True.
    """
    from tasks import lm

    return lm.lm_task(name=name, data_dir=data_dir, cache_dir=cache_dir)


def span_corruption_task(*, name: str, data_dir: str, noise_density: float = 0.15,
                         mean_noise_span_length: float = 3.0) -> str:
    """Registers T5's span-corruption task `name` over a prepared directory and returns the name.

    Args:
      name: the seqio task name to register.
      data_dir: a directory written by `t5x-lite prepare`.
      noise_density: fraction of tokens replaced by sentinels.
      mean_noise_span_length: mean length of each corrupted span.
    """
    from tasks import span_corruption

    return span_corruption.span_corruption_task(name=name, data_dir=data_dir, noise_density=noise_density,
                                                mean_noise_span_length=mean_noise_span_length)


def prefix_lm_task(*, name: str, data_dir: str) -> str:
    """Registers the prefix-LM task `name` (inputs: a random prefix, targets: the rest) and returns the name.

    Args:
      name: the seqio task name to register.
      data_dir: a directory written by `t5x-lite prepare`.
    """
    from tasks import prefix_lm

    return prefix_lm.prefix_lm_task(name=name, data_dir=data_dir)


def text_task(*, name: str, splits: dict[str, str], vocabulary: str, file_format: str | None = None,
              text_field: str = "text", on_bad_line: str = "fail") -> str:
    """Registers an LM task `name` over raw jsonl or TFRecord text files and returns the name.

    Args:
      name: the seqio task name to register.
      splits: file pattern per split, for example {'train': 'data/*.train.jsonl'}.
      vocabulary: a SentencePiece model file, or 'byte' for seqio's byte vocabulary.
      file_format: 'jsonl' or 'tfrecord'; None tells it from the file names.
      text_field: the jsonl field, or the tf.train.Example bytes feature, holding the text.
      on_bad_line: 'fail' (stop, naming the file and line) or 'skip' (skip, count and warn).
    """
    from tasks import text

    return text.text_task(name=name, splits=splits, vocabulary=vocabulary, file_format=file_format,
                          text_field=text_field, on_bad_line=on_bad_line)


def text_to_text_task(*, name: str, splits: dict[str, str], vocabulary: str, metrics: tuple[str, ...] = ("accuracy",),
                      inputs_field: str = "inputs", targets_field: str = "targets") -> str:
    """Registers a task `name` of (inputs, targets) text pairs with metrics and returns the name.

    Args:
      name: the seqio task name to register.
      splits: jsonl file pattern per split, for example {'validation': 'data/qa.val.jsonl'}.
      vocabulary: a SentencePiece model file (such as a run's MODEL_DIR/vocab/spm.model), or 'byte'.
      metrics: seqio metric functions by name: accuracy, sequence_accuracy, bleu, rouge
        (prediction metrics) and log_likelihood (a score metric); see tasks/text_to_text.py.
      inputs_field: the jsonl field holding the inputs text.
      targets_field: the jsonl field holding the targets text.
    """
    from tasks import text_to_text

    return text_to_text.text_to_text_task(name=name, splits=splits, vocabulary=vocabulary, metrics=metrics,
                                          inputs_field=inputs_field, targets_field=targets_field)


def mixture(*, name: str, tasks: list[tuple[str, float]], exhaust_all_tasks: bool = False) -> str:
    """Registers a seqio mixture `name` of registered tasks sampled by rate and returns the name.

    Args:
      name: the seqio mixture name to register.
      tasks: (task or mixture name, rate) pairs; rates are relative. A name may be a task
        factory's result, for example [(@a/lm_task(), 1.0), (@b/text_task(), 3.0)].
      exhaust_all_tasks: one epoch ends when every task is used up (True) or at the first draw
        of a used-up task (False, seqio's default); see tasks/mixtures.py.
    """
    from tasks import mixtures

    return mixtures.mixture(name=name, tasks=tasks, exhaust_all_tasks=exhaust_all_tasks)


def register_configurables() -> None:
    """Makes the library's functions and config classes bindable by these gin names."""
    if any(selector.split(".")[-1] == "train" for selector, _ in _registry_items()):
        return
    from t5x_lite import data, eval_loop, infer_loop, init_from, loops, optim, predict, retention, trainer
    from t5x_lite.models import decoder_only, encoder_decoder

    gin.external_configurable(loops.train, "train")
    gin.external_configurable(decoder_only.DecoderConfig, "DecoderConfig")
    gin.external_configurable(encoder_decoder.T5Config, "T5Config")
    gin.external_configurable(data.DataConfig, "DataConfig")
    gin.external_configurable(optim.OptimizerConfig, "OptimizerConfig")
    gin.external_configurable(trainer.LossConfig, "LossConfig")
    gin.external_configurable(retention.RetentionPolicy, "RetentionPolicy")
    gin.external_configurable(init_from.InitFrom, "InitFrom")
    gin.external_configurable(lm_task, "lm_task")
    gin.external_configurable(span_corruption_task, "span_corruption_task")
    gin.external_configurable(prefix_lm_task, "prefix_lm_task")
    gin.external_configurable(text_task, "text_task")
    gin.external_configurable(text_to_text_task, "text_to_text_task")
    gin.external_configurable(mixture, "mixture")
    gin.external_configurable(eval_loop.evaluate, "evaluate")
    gin.external_configurable(eval_loop.PerplexityEval, "PerplexityEval")
    gin.external_configurable(eval_loop.MultipleChoiceEval, "MultipleChoiceEval")
    gin.external_configurable(eval_loop.SeqioEval, "SeqioEval")
    gin.external_configurable(predict.DecodingConfig, "DecodingConfig")
    gin.external_configurable(infer_loop.infer, "infer")


def split_gin_flags(argv: Sequence[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """Splits argv into (gin files, gin bindings, search paths, remaining args)."""
    files, bindings, paths, rest = [], [], [], []
    args = list(argv)
    while args:
        arg = args.pop(0)
        key, eq, value = arg.partition("=")
        if key in ("--gin_file", "--gin_search_paths") and not eq:
            if not args:
                raise ConfigError(f"{key} needs a value.")
            value = args.pop(0)
        if key == "--gin_file":
            files.append(value)
        elif key == "--gin_search_paths":
            paths.extend(p for p in value.split(",") if p)
        elif key.startswith("--gin.") and eq:
            bindings.append(f"{key[len('--gin.'):]} = {value}")
        else:
            rest.append(arg)
    return files, bindings, paths, rest


def parse(*, gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
          gin_search_paths: Sequence[str] = (), skip_unknown: bool = False) -> None:
    """Parses gin files then bindings into gin's global config (cleared first).

    skip_unknown: skip bindings of configurables that are not registered (reading a run's saved
    config.gin, which also binds t5's and seqio's configurables, without importing them).
    """
    register_configurables()
    _drop_package_path_reader()
    gin.clear_config()
    # gin keeps search paths across parses; start from its initial [''] so an earlier parse's
    # working directory or --gin_search_paths cannot shadow this one's.
    gin.config._LOCATION_PREFIXES[:] = [""]  # noqa: SLF001 - gin has no API to reset them
    for path in [*gin_search_paths, os.getcwd(), str(builtin_gin_dir())]:
        gin.add_config_file_search_path(path)
    if not gin_files:
        raise ConfigError("No --gin_file given; for example --gin_file=runs/quickstart.gin.")
    try:
        with _quiet_search_misses():
            gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings), finalize_config=False,
                                                skip_unknown=skip_unknown)
    except IOError as e:
        raise ConfigError(f"{e}\nGin files are searched in: {', '.join(gin_search_paths) or '(no --gin_search_paths)'}, "
                          f"the current directory, and {builtin_gin_dir()}.") from None
    except (ValueError, SyntaxError) as e:
        raise ConfigError(_with_suggestion(str(e))) from None


def _drop_package_path_reader() -> None:
    """Stops gin from reading 'pkg/file.gin' as a file inside Python package `pkg`.

    That reader crashes when the current directory holds a plain folder of the same name (a
    namespace package, such as a `runs/` model directory next to `runs/quickstart.gin`), and
    t5x_lite finds its files through search paths instead.
    """
    from gin import resource_reader

    gin.config._FILE_READERS[:] = [  # noqa: SLF001 - gin has no API to unregister a reader
        (reader, exists) for reader, exists in gin.config._FILE_READERS  # noqa: SLF001
        if exists is not resource_reader.system_path_file_exists
    ]


@contextlib.contextmanager
def _quiet_search_misses():
    """Hides gin's 'Path not found' log line for each search path that lacks a file."""
    def drop_misses(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Path not found")

    root = logging.getLogger()
    root.addFilter(drop_misses)
    try:
        yield
    finally:
        root.removeFilter(drop_misses)


def _with_suggestion(message: str) -> str:
    """Adds 'did you mean' for an unknown configurable or parameter named in a gin error."""
    configurables = own_configurables()
    unknown = re.search(r"No configurable matching (?:reference '@(?:[\w.]+/)*|')([\w.]+)", message)
    if unknown:
        close = difflib.get_close_matches(unknown.group(1), list(configurables), n=3)
        hint = f"Did you mean {', '.join(close)}? " if close else ""
        return f"{message}\n{hint}Configurables: {', '.join(sorted(configurables))}."
    bad_param = re.search(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'", message)
    if bad_param and bad_param.group(1).split(".")[-1] in configurables:
        name = bad_param.group(1).split(".")[-1]
        params = _params_of(configurables[name])
        close = difflib.get_close_matches(bad_param.group(2), params, n=3)
        hint = f"Did you mean {', '.join(close)}? " if close else ""
        return f"{message}\n{hint}Parameters of {name}: {', '.join(params)}."
    return message


def is_own(fn_or_cls) -> bool:
    """A configurable of t5x_lite (or its tasks/), not one of gin's, t5's or seqio's."""
    return getattr(fn_or_cls, "__module__", "").split(".")[0] in ("t5x_lite", "tasks")


def own_configurables() -> dict:
    """Registered name -> function or class, for every configurable t5x_lite registers."""
    return {c.name: c.wrapped for _, c in _registry_items() if is_own(c.wrapped)}


def _registry_items():
    return gin.config._REGISTRY.items()  # noqa: SLF001


def _params_of(fn_or_cls) -> list[str]:
    import inspect

    target = fn_or_cls.__init__ if inspect.isclass(fn_or_cls) else fn_or_cls
    return [p for p in inspect.signature(target).parameters if p != "self"]
