"""Whether a run's training data can be read by index, and what that reading needs.

The index path (data/indexed/indexed_input.py) reads rows by number from a split's offset index
(data/records/record_index.py). It can read a task whose rows are a function of stored tokens alone:
an LM task over a prepared directory (`lm_task`: documents + EOS, packed), an LM task's offline
cache (`use_cached=True`: `lm_task`, or `text_task` whose cache holds the tokenized text), or a
mixture of such tasks. Everything else is read by streaming through seqio's tf.data pipeline:
tasks with on-the-fly preprocessing (raw text read uncached, span corruption's noise, prefix
LM's split points), other feature converters, unpacked rows, and mixtures with
`exhaust_all_tasks`. `plan` says which, and why, for the start-up line. The rules are
data/indexed/epochs.py's (which `t5x-lite estimate` follows too); this module describes the registered
task or mixture to them and reads the split entries they ask for.

Prepared LM tasks and their mixtures are known from data/task_registry.py, without seqio. The
seqio task modules of data/tasks/ register here what they know of their own tasks
(`register_lm_task`, `register_mixture`); a registration counts only while seqio still holds the
same object under that name, so a task re-registered in another way is not mistaken for an
indexable one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from t5x_lite.data.indexed import epochs
from t5x_lite.data.records import prepared_dataset, record_index
from t5x_lite.data import task_registry
from t5x_lite.data.task_access import DataConfig, get_task, task_vocabulary
from t5x_lite.data.vocab import tokenizer_files
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


def _node(name: str) -> epochs.Node:
    """Task or mixture `name` as the index rules see it (data/indexed/epochs.py), from what the task modules
    registered here and in data/task_registry.py."""
    entry = task_registry.lookup(name)
    if isinstance(entry, task_registry.PreparedMixture):
        return epochs.Mixture(name, tuple((_node(task), rate) for task, rate in entry.tasks), entry.exhaust_all_tasks)
    if isinstance(entry, task_registry.PreparedTask):
        return epochs.Task(name, lm=True, data_dir=entry.data_dir)
    provider = get_task(name)
    if name in _MIXTURES and _MIXTURES[name][0] is provider:
        _, pairs, exhaust = _MIXTURES[name]
        return epochs.Mixture(name, tuple((_node(task), rate) for task, rate in pairs), exhaust)
    if name in _LM_TASKS and _LM_TASKS[name][0] is provider:
        return epochs.Task(name, lm=True, data_dir=_LM_TASKS[name][1])
    return epochs.Task(name, lm=False, data_dir=None)


def _cache_dir(task: epochs.Task) -> str | None:
    return get_task(task.name).cache_dir


def _plan(config: DataConfig) -> IndexPlan:
    sources = epochs.index_sources(
        lambda: _node(config.mixture_or_task_name), split=config.split, reader=config.reader,
        converter=config.converter, pack=config.pack, use_cached=config.use_cached, cache_dir_of=_cache_dir,
        entry_of=lambda directory, cached: prepared_dataset.split_entry(
            directory, config.split, cached=cached))
    tasks = tuple(IndexedTask(name=s.task, records=record_index.SplitRecords(s.directory, config.split, s.entry),
                              rate=s.rate) for s in sources)
    vocabulary = task_vocabulary(tasks[0].name)
    return IndexPlan(tasks=tasks, length=config.sequence_length, eos_id=int(vocabulary.eos_id),
                     start_id=int(tokenizer_files.decoder_start_id(vocabulary)), seed=config.seed,
                     shuffle=config.shuffle)


def plan(config: DataConfig) -> tuple[IndexPlan | None, str]:
    """(the index plan, '') when `config` is read by index, else (None, why it is streamed).

    DataConfig.reader='index' makes a reason to stream an error (ConfigValueError naming it);
    'stream' always streams.
    """
    try:
        return _plan(config), ""
    except epochs.NotIndexable as e:
        if config.reader == "index":
            raise ConfigValueError(f"DataConfig.reader='index', but {config.mixture_or_task_name!r} cannot be read "
                                   f"by index: {e}. Use reader='auto' or 'stream' to read it by streaming.") from None
        return None, str(e)
