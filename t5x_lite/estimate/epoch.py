"""Tokens and steps per epoch of the train task, from the `metadata.json` that `t5x-lite prepare` writes.

The estimate never reads the data itself: the corpus token and document counts in the metadata
give lm_task's epoch by arithmetic, exactly when the split has an offset index and the run reads
it by index (rows of the token stream: docs/data.md), else as a lower bound (streaming packs
pieces greedily). Other task factories rewrite documents into rows, so their
epoch is only known when `t5x-lite train` counts it; the result then says why it is unknown.
"""

from __future__ import annotations

import math
from typing import Any

from t5x_lite import storage
from t5x_lite.data import prepared_dataset
from t5x_lite.estimate import arithmetic as estimate_math
from t5x_lite.estimate.run_from_gin import TaskSource


def epoch_estimate(*, task: TaskSource, train_data: Any) -> dict[str, Any]:
    """Tokens and steps per epoch from the task's prepared metadata, or None with the reason why not."""
    unknown = {"tokens_per_epoch": None, "steps_per_epoch": None, "documents": None}
    if task.data_dir is None:
        why = ("the config names no task (MIXTURE_OR_TASK_NAME)" if task.name is None and task.factory is None
               else f"the task {task.name!r} is not a prepared directory read by lm_task" if task.factory is None
               else f"{task.factory} does not read a `t5x-lite prepare` directory")
        return {**unknown, "note": f"unknown: {why}; `t5x-lite train` counts the steps of each epoch as it starts"}

    try:
        metadata = prepared_dataset.read_metadata(task.data_dir)
    except (OSError, ValueError, storage.StorageError) as e:  # unreadable: the estimate goes on without it
        return {**unknown, "note": f"unknown: cannot read metadata.json of {task.data_dir!r} ({e})"}
    if metadata is None:
        return {**unknown, "note": f"unknown: {task.data_dir!r} has no metadata.json (not prepared yet? "
                                   "run `t5x-lite prepare --input=... --out=DIR`)"}
    split = metadata.get("splits", {}).get(train_data.split)
    if not split or "num_tokens" not in split:
        return {**unknown, "note": f"unknown: metadata.json of {task.data_dir!r} has no {train_data.split!r} split"}
    documents, corpus_tokens = int(split["num_examples"]), int(split["num_tokens"])
    if task.factory != "lm_task" or train_data.converter != "lm":
        return {**unknown, "documents": documents, "corpus_tokens": corpus_tokens,
                "note": f"{corpus_tokens:,} corpus tokens; rows per epoch unknown: {task.factory} rewrites the "
                        "documents into rows (counted when `t5x-lite train` starts)"}
    index = split.get("index")
    if index and train_data.reader != "stream" and train_data.pack and not train_data.use_cached:
        stream = int(index["stream_tokens"])
        rows = math.ceil(stream / train_data.sequence_length)
        return {"tokens_per_epoch": stream, "steps_per_epoch": math.ceil(rows / train_data.batch_size),
                "documents": documents, "corpus_tokens": corpus_tokens, "exact": True,
                "note": f"{corpus_tokens:,} tokens (metadata.json) + an EOS for each of {documents:,} documents"}
    pieces = estimate_math.lm_pieces(corpus_tokens=corpus_tokens, documents=documents, sequence_length=train_data.sequence_length)
    tokens = corpus_tokens + pieces  # lm_task appends one EOS to each piece
    steps = estimate_math.steps_per_epoch(tokens_per_epoch=tokens, batch_size=train_data.batch_size,
                            sequence_length=train_data.sequence_length)
    return {"tokens_per_epoch": tokens, "steps_per_epoch": steps, "documents": documents,
            "corpus_tokens": corpus_tokens,
            "note": f"{corpus_tokens:,} tokens (metadata.json) + an EOS for each of >= {pieces:,} document pieces"}
