"""Whether a run's training data can be read by index, and what that reading needs.

The index path (data/indexed_input.py) reads rows by number from a split's offset index
(data/record_index.py). It can read a task whose rows are a function of stored tokens alone:
an LM task over a prepared directory (`lm_task`: documents + EOS, packed), an LM task's offline
cache (`use_cached=True`: `lm_task`, or `text_task` whose cache holds the tokenized text), or a
mixture of such tasks. Everything else is read by streaming through seqio's tf.data pipeline:
tasks with on-the-fly preprocessing (raw text read uncached, span corruption's noise, prefix
LM's split points), other feature converters, unpacked rows, and mixtures with
`exhaust_all_tasks`. `plan` says which, and why, for the start-up line.

The task modules of tasks/ register here what they know of a task (`register_lm_task`,
`register_mixture`); a registration counts only while seqio still holds the same object
under that name, so a task re-registered in another way is not mistaken for an indexable one.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

from t5x_lite import storage
from t5x_lite.data import prepared_dataset, record_index, tokenizer_files
from t5x_lite.data.task_access import DataConfig, get_task
from t5x_lite.errors import ConfigValueError

_LM_TASKS: dict[str, tuple[Any, str | None]] = {}  # name -> (seqio task, prepared directory or None)
_MIXTURES: dict[str, tuple[Any, tuple[tuple[str, float], ...], bool]] = {}  # name -> (mixture, rates, exhaust)


def register_lm_task(name: str, task: Any, data_dir: str | None) -> None:
    """Records that seqio task `name` (`task`) is an LM task over the prepared directory `data_dir`
    (None: over raw text, indexable only through its offline cache)."""
    _LM_TASKS[name] = (task, data_dir)


def register_mixture(name: str, mixture: Any, tasks: Sequence[tuple[str, float]], *, exhaust_all_tasks: bool) -> None:
    """Records mixture `name`'s (task, rate) pairs and whether it exhausts all tasks."""
    _MIXTURES[name] = (mixture, tuple((t, float(r)) for t, r in tasks), exhaust_all_tasks)


@dataclasses.dataclass(frozen=True)
class IndexedTask:
    name: str
    records: record_index.SplitRecords
    rate: float


@dataclasses.dataclass(frozen=True)
class IndexPlan:
    """What the index path reads: tasks (one, or a mixture's with rates) and how rows are made."""

    tasks: tuple[IndexedTask, ...]
    length: int
    eos_id: int
    start_id: int
    seed: int
    shuffle: bool


class NotIndexable(Exception):
    """Why a task is read by streaming (the message is the reason)."""


def _leaves(name: str, rate: float, split: str) -> list[tuple[str, str | None, float]]:
    """(task name, prepared directory, rate) of each task under `name`, or NotIndexable."""
    provider = get_task(name)
    if name in _MIXTURES and _MIXTURES[name][0] is provider:
        _, pairs, exhaust = _MIXTURES[name]
        if exhaust:
            raise NotIndexable(f"mixture {name!r} has exhaust_all_tasks=True")
        total = sum(r for _, r in pairs)
        return [leaf for task, r in pairs for leaf in _leaves(task, rate * r / total, split)]
    if name in _LM_TASKS and _LM_TASKS[name][0] is provider:
        return [(name, _LM_TASKS[name][1], rate)]
    raise NotIndexable(f"task {name!r} is not an lm_task over a prepared directory (its examples are made "
                       "while reading)")


def _cached_entry(name: str, split: str) -> tuple[str, dict]:
    """(cache directory, split entry) of task `name`'s indexed offline cache, or NotIndexable."""
    cache_dir = get_task(name).cache_dir
    if not cache_dir:
        raise NotIndexable(f"task {name!r} has no offline cache")
    path = storage.join(cache_dir, record_index.cached_entry_name(split))
    if not storage.exists(path):
        raise NotIndexable(f"the offline cache of {name!r} in {cache_dir!r} has no index for split {split!r} "
                           "(build the cache again with `t5x-lite cache ... --overwrite`)")
    with storage.open(path, "r") as f:
        return cache_dir, json.load(f)


def _split_entry(name: str, data_dir: str | None, config: DataConfig) -> tuple[str, dict]:
    """(directory, split entry) that task `name` is read from by index, or NotIndexable."""
    if config.use_cached:
        return _cached_entry(name, config.split)
    if data_dir is None:
        raise NotIndexable(f"task {name!r} tokenizes raw text while reading (cache it with `t5x-lite cache` and "
                           "read the cache, use_cached=True, to read it by index)")
    entry = (prepared_dataset.read_metadata(data_dir) or {}).get("splits", {}).get(config.split)
    if entry is None:
        raise NotIndexable(f"{data_dir!r} has no split {config.split!r}")
    if "index" not in entry:
        raise NotIndexable(f"{data_dir!r} has no index for split {config.split!r} (write one with "
                           f"`t5x-lite index {data_dir}`)")
    return data_dir, entry


def _plan(config: DataConfig) -> IndexPlan:
    if config.converter != "lm":
        raise NotIndexable(f"feature converter {config.converter!r} (the index path makes 'lm' rows)")
    if not config.pack:
        raise NotIndexable("pack=False (the index path packs rows)")
    tasks = []
    for name, data_dir, rate in _leaves(config.mixture_or_task_name, 1.0, config.split):
        directory, entry = _split_entry(name, data_dir, config)
        tasks.append(IndexedTask(name=name, records=record_index.SplitRecords(directory, config.split, entry),
                                 rate=rate))
    vocabulary = get_task(tasks[0].name).output_features["targets"].vocabulary
    return IndexPlan(tasks=tuple(tasks), length=config.sequence_length, eos_id=int(vocabulary.eos_id),
                     start_id=int(tokenizer_files.decoder_start_id(vocabulary)), seed=config.seed,
                     shuffle=config.shuffle)


def plan(config: DataConfig) -> tuple[IndexPlan | None, str]:
    """(the index plan, '') when `config` is read by index, else (None, why it is streamed).

    DataConfig.reader='index' makes a reason to stream an error (ConfigValueError naming it);
    'stream' always streams.
    """
    if config.reader == "stream":
        return None, "DataConfig.reader='stream'"
    try:
        return _plan(config), ""
    except NotIndexable as e:
        if config.reader == "index":
            raise ConfigValueError(f"DataConfig.reader='index', but {config.mixture_or_task_name!r} cannot be read "
                                   f"by index: {e}. Use reader='auto' or 'stream' to read it by streaming.") from None
        return None, str(e)
