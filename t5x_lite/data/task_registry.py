"""Tasks over prepared directories, known without seqio: LM tasks and mixtures of them.

A directory written by `t5x-lite prepare` holds token ids, a vocabulary and an offset index. An
LM task over it (its documents + EOS, packed) needs nothing more to be trained on by index
(data/indexed/), validated, or to give its vocabulary, so the `lm_task` and `mixture` factories
(data/task_factories.py) register such tasks here, and seqio (with TensorFlow and t5) is
imported only when something asks for the seqio task itself: streaming, caching, seqio metrics.
`seqio_task` registers it then, through the function the factory gave.

A name registered in seqio by other code (a user's task module, with seqio directly) belongs to
that code: `lookup` no longer answers for it, so a task re-registered another way is never read
as this one.
"""

from __future__ import annotations

import dataclasses
import numbers
import sys
from typing import Any, Callable

from t5x_lite import storage
from t5x_lite.data.records import prepared_dataset, record_index, tfrecord_stream
from t5x_lite.data.vocab import hf_vocabulary
from t5x_lite.errors import TaskDataError


@dataclasses.dataclass(eq=False)
class PreparedTask:
    """An LM task over a prepared directory; `in_seqio` registers (and returns) its seqio task."""

    name: str
    data_dir: str
    cache_dir: str | None
    in_seqio: Callable[[], Any]
    seqio_object: Any = None

    def key(self) -> tuple:
        return ("task", self.name, self.data_dir, self.cache_dir)


@dataclasses.dataclass(eq=False)
class PreparedMixture:
    """A mixture of registered prepared tasks (or mixtures) by rate (data/indexed/mixing.py)."""

    name: str
    tasks: tuple[tuple[str, float], ...]
    exhaust_all_tasks: bool
    in_seqio: Callable[[], Any]
    seqio_object: Any = None

    def key(self) -> tuple:
        return ("mixture", self.name, self.tasks, self.exhaust_all_tasks)


Entry = PreparedTask | PreparedMixture
_REGISTRY: dict[str, Entry] = {}


def register(entry: Entry) -> None:
    """Registers `entry`; an equal registration already there is kept (with its seqio task). One that
    differs is replaced, its seqio task (if it made one) removed from seqio's registry with it."""
    held = _REGISTRY.get(entry.name)
    if held is not None and held.key() == entry.key():
        return
    if held is not None and held.seqio_object is not None:
        _forget_in_seqio(held)
    _REGISTRY[entry.name] = entry


def _forget_in_seqio(entry: Entry) -> None:
    """Removes `entry`'s seqio task or mixture from seqio's registry while seqio still holds it."""
    seqio = sys.modules.get("seqio")
    if seqio is None:
        return
    try:
        held = seqio.get_mixture_or_task(entry.name)
    except ValueError:
        return
    if held is entry.seqio_object:
        (seqio.MixtureRegistry if isinstance(entry, PreparedMixture) else seqio.TaskRegistry).remove(entry.name)


def lookup(name: str) -> Entry | None:
    """The prepared task or mixture `name`; None when it is not one (or seqio holds another task
    under that name)."""
    entry = _REGISTRY.get(name)
    seqio = sys.modules.get("seqio")
    if entry is None or seqio is None:
        return entry
    try:
        held = seqio.get_mixture_or_task(name)
    except ValueError:
        return entry
    return entry if held is entry.seqio_object else None


def seqio_task(entry: Entry) -> Any:
    """The seqio task or mixture of `entry`, registered in seqio on first use."""
    if entry.seqio_object is None:
        if isinstance(entry, PreparedMixture):
            for task, _ in entry.tasks:
                seqio_task(_REGISTRY[task])
        entry.seqio_object = entry.in_seqio()
    return entry.seqio_object


def task_entries(entry: Entry) -> list[PreparedTask]:
    """The prepared tasks under `entry` (itself, or a mixture's, recursively), in order."""
    if isinstance(entry, PreparedTask):
        return [entry]
    return [task for name, _ in entry.tasks for task in task_entries(_REGISTRY[name])]


# ---------------------------------------------------------------------------- prepared directories


def read_metadata(data_dir: str) -> dict:
    """The metadata.json of a prepared directory (local, gs:// or s3://), or a clear error."""
    try:
        metadata = prepared_dataset.read_metadata(data_dir)
    except storage.StorageError as e:  # no credentials: the message says what to set
        raise TaskDataError(str(e)) from None
    if metadata is None:
        raise TaskDataError(
            f"Data directory {data_dir!r} has no {prepared_dataset.METADATA_FILE}: it is missing (check the bucket "
            f"and prefix of a gs:// or s3:// path) or was never prepared. Run `t5x-lite prepare "
            f"--input=... --out={data_dir}` (or point the task's data_dir at a prepared directory)."
        )
    for split, info in metadata["splits"].items():
        if not info.get("num_examples"):
            raise TaskDataError(f"Split {split!r} of {data_dir!r} has no records; re-run `t5x-lite prepare` on a "
                                "non-empty input.")
    return metadata


def vocabulary(data_dir: str, *, extra_ids: int = 0) -> Any:
    """The vocabulary of a prepared directory: its SentencePiece model (seqio's ids), or the Hugging
    Face tokenizer it was prepared with (--tokenizer; that tokenizer's own special ids)."""
    return hf_vocabulary.prepared_vocabulary(data_dir, read_metadata(data_dir), extra_ids=extra_ids)


def entry_vocabulary(entry: Entry) -> Any:
    """The `targets` vocabulary of a prepared task or mixture (a mixture's tasks share one)."""
    return vocabulary(task_entries(entry)[0].data_dir)


def split_entry(task: PreparedTask, split: str, *, what: str | None = None) -> dict:
    """The metadata.json entry of a prepared task's split; TaskDataError naming the splits it has."""
    splits = read_metadata(task.data_dir)["splits"]
    if split not in splits:
        raise TaskDataError(f"{what or task.name!r} has no split {split!r}; its splits are {sorted(splits)}. Set "
                            "DataConfig.split (train/DataConfig.split or eval/DataConfig.split).")
    return splits[split]


def split_documents(task: PreparedTask, split: str, *, max_tokens: int, limit: int | None = None) -> list[list[int]]:
    """The `targets` of a prepared task's split as its seqio LM task gives them at that length: each
    document, shard by shard, cut into pieces of `max_tokens` - 1 ids, each piece followed by EOS
    (the first `limit` pieces; None: all)."""
    entry = split_entry(task, split)
    eos, step = vocabulary(task.data_dir).eos_id, max_tokens - 1
    documents: list[list[int]] = []

    def add(records: list[bytes]) -> bool:
        for ids in record_index.parse_targets(records):
            ids = ids.tolist()
            documents.extend(ids[start:start + step] + [eos] for start in range(0, len(ids), step))
        return limit is not None and len(documents) >= limit

    for path in record_index.shard_paths(task.data_dir, entry):
        pending = []
        for record in tfrecord_stream.iter_records(path):
            pending.append(record)
            if len(pending) == 1024:
                if add(pending):
                    return documents[:limit]
                pending = []
        if add(pending):
            return documents[:limit]
    return documents


# ---------------------------------------------------------------------------- mixtures


def check_mixture(name: str, tasks: Any, *, known: set[str], task_names: set[str]) -> None:
    """Mixture `name`'s (task, rate) pairs name `known` tasks or mixtures at positive rates, and
    `name` is no task's name (`task_names`); TaskDataError otherwise."""
    if not tasks:
        raise TaskDataError(f"Mixture {name!r} has no tasks; give (task name, rate) pairs.")
    for pair in tasks:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TaskDataError(f"Mixture {name!r}: each task is a (task name, rate) pair, not {pair!r}.")
        task, rate = pair
        if task not in known:
            raise TaskDataError(f"Mixture {name!r}: no task or mixture named {task!r} is registered. Known: "
                                f"{sorted(known)}. Register it first (its factory returns the name).")
        if not isinstance(rate, numbers.Real) or isinstance(rate, bool) or rate <= 0:
            raise TaskDataError(f"Mixture {name!r}: the rate of {task!r} is {rate!r}; rates are positive numbers.")
    if name in task_names:
        raise TaskDataError(f"Mixture name {name!r} is already a task's name; choose another.")


def registered_names() -> set[str]:
    """The names of the prepared tasks and mixtures registered here."""
    return {name for name in _REGISTRY if lookup(name) is not None}


def prepared_task_names() -> set[str]:
    return {name for name in registered_names() if isinstance(_REGISTRY[name], PreparedTask)}
