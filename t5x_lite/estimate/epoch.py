"""Tokens and steps per epoch of the train task, from the files `t5x-lite prepare` and `t5x-lite cache` write.

The estimate never reads the data itself. Whether the run reads its data by index, and how long
an epoch is then, follow data/indexed/epochs.py's rules, which the reader follows too: an lm_task, or a
mixture of them, whose split has an offset index (its prepared directory's, or with use_cached
its offline cache's) gives the exact epoch from the index's stream length (metadata.json, or
the cache's split entry). A single lm_task read by streaming gets a lower bound from the
corpus token and document counts (streaming packs pieces greedily). Other task factories
rewrite documents into rows, so their epoch is only known when `t5x-lite train` counts it;
the result then says why it is unknown.
"""

from __future__ import annotations

from typing import Any

from t5x_lite import storage
from t5x_lite.config.resolve import DeferredCall
from t5x_lite.data.indexed import epochs
from t5x_lite.data.records import prepared_dataset
from t5x_lite.estimate import arithmetic as estimate_math
from t5x_lite.estimate.run_from_gin import TaskSource

_COUNTED = "`t5x-lite train` counts the steps of each epoch as it starts"


def _node(call: Any) -> epochs.Node | None:
    """The task or mixture a factory call registers, as data/indexed/epochs.py's rules see it; None when
    a part of it is a plain task name (registered by a module of the user's: unknown here)."""
    if not isinstance(call, DeferredCall):
        return None
    name = call.kwargs.get("name")
    if call.name != "mixture":
        return epochs.Task(name, lm=call.name in ("lm_task", "text_task"),
                           data_dir=call.kwargs.get("data_dir") if call.name == "lm_task" else None)
    parts = []
    for task, rate in call.kwargs.get("tasks", ()):
        part = _node(task)
        if part is None:
            return None
        parts.append((part, float(rate)))
    return epochs.Mixture(name, tuple(parts), bool(call.kwargs.get("exhaust_all_tasks", False)))


def _cache_dirs(call: Any) -> list[str]:
    """The cache_dir of every lm_task under `call`: seqio looks for any task's cache in all of them."""
    if not isinstance(call, DeferredCall):
        return []
    if call.name == "mixture":
        return [d for task, _ in call.kwargs.get("tasks", ()) for d in _cache_dirs(task)]
    return [call.kwargs["cache_dir"]] if call.kwargs.get("cache_dir") else []


def _cache_dir_finder(call: Any):
    """`cache_dir_of` for epochs.index_sources: where seqio would find the task's finished cache."""
    roots = _cache_dirs(call)

    def cache_dir_of(task: epochs.Task) -> str | None:
        for root in roots:
            directory = storage.join(storage.absolute(root), *task.name.split(":"))
            if storage.exists(storage.join(directory, "COMPLETED")):
                return directory
        return None

    return cache_dir_of


def _unknown(note: str, **known: Any) -> dict[str, Any]:
    return {"tokens_per_epoch": None, "steps_per_epoch": None, "documents": None, **known, "note": note}


def epoch_estimate(*, task: TaskSource, train_data: Any) -> dict[str, Any]:
    """Tokens and steps per epoch from the task's prepared metadata or offline cache, or None with the reason why not."""
    if task.factory is None:
        why = ("the config names no task (MIXTURE_OR_TASK_NAME)" if task.name is None
               else f"the task {task.name!r} is not made by a task factory (lm_task, mixture, ...)")
        return _unknown(f"unknown: {why}; {_COUNTED}")
    root = _node(task.call)
    if root is None:
        return _unknown(f"unknown: {task.factory} {task.name!r} names a task that no task factory makes; {_COUNTED}")
    metadata = None
    if task.data_dir is not None:  # one task over a prepared directory: its counts, or why not
        try:
            metadata = prepared_dataset.read_metadata(task.data_dir)
        except (OSError, ValueError, storage.StorageError) as e:  # unreadable: the estimate goes on without it
            return _unknown(f"unknown: cannot read metadata.json of {task.data_dir!r} ({e})")
        if metadata is None:
            return _unknown(f"unknown: {task.data_dir!r} has no metadata.json (not prepared yet? "
                            "run `t5x-lite prepare --input=... --out=DIR`)")
        split = metadata.get("splits", {}).get(train_data.split)
        if not split or "num_tokens" not in split:
            return _unknown(f"unknown: metadata.json of {task.data_dir!r} has no {train_data.split!r} split")
    try:
        sources = epochs.index_sources(
            lambda: root, split=train_data.split, reader=train_data.reader, converter=train_data.converter,
            pack=train_data.pack, use_cached=train_data.use_cached, cache_dir_of=_cache_dir_finder(task.call),
            entry_of=lambda directory, cached: prepared_dataset.split_entry(directory, train_data.split, cached=cached))
    except epochs.NotIndexable as e:
        return _streamed(str(e), task=task, train_data=train_data, metadata=metadata)
    except (OSError, ValueError, storage.StorageError) as e:
        return _unknown(f"unknown: cannot read the data's split entries ({e})")
    return _indexed(sources, train_data=train_data)


def _indexed(sources: list[epochs.IndexSource], *, train_data: Any) -> dict[str, Any]:
    """The exact epoch of data read by index (what the run prints at start)."""
    epoch = epochs.indexed_epoch([s.stream_tokens for s in sources], [s.rate for s in sources],
                                 length=train_data.sequence_length, global_batch=train_data.batch_size)
    if len(sources) > 1:
        tokens = epoch.positions * train_data.sequence_length
        return {"tokens_per_epoch": tokens, "steps_per_epoch": epoch.steps, "documents": None, "exact": True,
                "read": "by index", "note": f"{epoch.positions:,} rows of {train_data.sequence_length} tokens from "
                                            f"{len(sources)} tasks at their rates (the scarcest fills one of its epochs)"}
    (source,) = sources
    documents = int(source.entry["num_examples"])
    out = {"tokens_per_epoch": source.stream_tokens, "steps_per_epoch": epoch.steps, "documents": documents,
           "exact": True, "read": "by index"}
    if "num_tokens" in source.entry:
        corpus_tokens = int(source.entry["num_tokens"])
        return {**out, "corpus_tokens": corpus_tokens,
                "note": f"{corpus_tokens:,} tokens (metadata.json) + an EOS for each of {documents:,} documents"}
    return {**out, "note": f"the offline cache's {documents:,} documents + an EOS each ({source.directory})"}


def _streamed(reason: str, *, task: TaskSource, train_data: Any, metadata: dict | None) -> dict[str, Any]:
    """A lower bound of a single lm_task's streamed epoch, or why the epoch is unknown."""
    if train_data.reader == "index":
        return _unknown(f"unknown: DataConfig.reader='index', but the data cannot be read by index: {reason} "
                        "(`t5x-lite train` stops on it)")
    if metadata is None:
        return _unknown(f"unknown: read by streaming ({reason}); {_COUNTED}", read=f"streaming: {reason}")
    split = metadata["splits"][train_data.split]
    documents, corpus_tokens = int(split["num_examples"]), int(split["num_tokens"])
    if task.factory != "lm_task" or train_data.converter != "lm":
        maker = task.factory if task.factory != "lm_task" else f"the {train_data.converter!r} feature converter"
        return _unknown(f"{corpus_tokens:,} corpus tokens; rows per epoch unknown: {maker} rewrites the "
                        "documents into rows (counted when `t5x-lite train` starts)",
                        documents=documents, corpus_tokens=corpus_tokens, read=f"streaming: {reason}")
    pieces = estimate_math.lm_pieces(corpus_tokens=corpus_tokens, documents=documents,
                                     sequence_length=train_data.sequence_length)
    tokens = corpus_tokens + pieces  # lm_task appends one EOS to each piece
    steps = estimate_math.steps_per_epoch(tokens_per_epoch=tokens, batch_size=train_data.batch_size,
                                          sequence_length=train_data.sequence_length)
    return {"tokens_per_epoch": tokens, "steps_per_epoch": steps, "documents": documents,
            "corpus_tokens": corpus_tokens, "read": f"streaming: {reason}",
            "note": f"{corpus_tokens:,} tokens (metadata.json) + an EOS for each of >= {pieces:,} document pieces"}
