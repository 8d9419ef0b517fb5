"""Text-to-text tasks with metrics: jsonl files of {"inputs": ..., "targets": ...} pairs.

The task seqio's Evaluator runs: its `metric_fns` score the model's predictions (accuracy,
sequence accuracy, BLEU and ROUGE from `t5.evaluation.metrics`) or its log-likelihood of the
targets (`log_likelihood`, a score metric). Train on it as well: the encoder-decoder reads
inputs and targets, a decoder-only model reads them as a prefix LM.
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np

from t5x_lite.data.tasks.text import check_split_files, load_vocabulary
from t5x_lite.errors import TaskDataError
from t5x_lite.tf_setup import import_tensorflow

tf = import_tensorflow()

import seqio  # noqa: E402
from t5.evaluation import metrics as t5_metrics  # noqa: E402


def log_likelihood(targets, scores) -> dict[str, float]:
    """Mean log-likelihood of the targets (a seqio score metric: it receives the model's scores)."""
    del targets
    return {"log_likelihood": float(np.mean(scores))}


# Metric name -> seqio metric function. Prediction metrics take (targets, predictions);
# score metrics take (targets, scores).
METRICS = {
    "accuracy": t5_metrics.accuracy,
    "sequence_accuracy": t5_metrics.sequence_accuracy,
    "bleu": t5_metrics.bleu,
    "rouge": t5_metrics.rouge,
    "log_likelihood": log_likelihood,
}


class PairSource(seqio.FileDataSource):
    """{"inputs", "targets"} strings from jsonl files; a bad line stops reading, naming the file and line."""

    def __init__(self, split_to_filepattern: dict[str, str], *, inputs_field: str, targets_field: str):
        self.fields = {"inputs": inputs_field, "targets": targets_field}
        super().__init__(read_file_fn=self._read, split_to_filepattern=split_to_filepattern)

    def _read(self, path: tf.Tensor) -> tf.data.Dataset:
        spec = {k: tf.TensorSpec([], tf.string) for k in self.fields}
        return tf.data.Dataset.from_generator(self._pairs, args=(path,), output_signature=spec)

    def _pairs(self, path: bytes):
        path = path.decode()
        with tf.io.gfile.GFile(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                if line.strip():
                    yield parse_pair(line, self.fields, where=f"{path}, line {number}")


def parse_pair(line: bytes | str, fields: dict[str, str], *, where: str) -> dict[str, str]:
    """{'inputs': ..., 'targets': ...} from one jsonl line, or a TaskDataError naming `where`."""
    try:
        record = json.loads(line)
    except ValueError as e:
        raise TaskDataError(f"{where}: not valid JSON ({e}).") from None
    if not isinstance(record, dict):
        raise TaskDataError(f"{where}: expected a JSON object with fields {sorted(fields.values())}.")
    pair = {}
    for feature, field in fields.items():
        if not isinstance(record.get(field), str):
            raise TaskDataError(f"{where}: no string field {field!r} (the task reads {sorted(fields.values())}).")
        pair[feature] = record[field]
    return pair


def register_text_to_text_task(name: str, splits: dict[str, str], vocabulary: str, *,
                               metrics: tuple[str, ...] = ("accuracy",), inputs_field: str = "inputs",
                               targets_field: str = "targets") -> seqio.Task:
    """Registers (or re-registers) task `name`; checks the files and the metric names first."""
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise TaskDataError(f"Unknown metrics {unknown} for task {name!r}; choose from {sorted(METRICS)}.")
    splits = {split: os.path.expanduser(pattern) for split, pattern in splits.items()}
    check_split_files(splits)
    vocab = load_vocabulary(vocabulary)
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    return seqio.TaskRegistry.add(
        name,
        source=PairSource(splits, inputs_field=inputs_field, targets_field=targets_field),
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
        output_features={"inputs": seqio.Feature(vocabulary=vocab, add_eos=True),
                         "targets": seqio.Feature(vocabulary=vocab, add_eos=True)},
        metric_fns=[METRICS[m] for m in metrics],
    )


@functools.cache
def _registered(name: str, splits: tuple[tuple[str, str], ...], vocabulary: str, metrics: tuple[str, ...],
                inputs_field: str, targets_field: str) -> str:
    register_text_to_text_task(name, dict(splits), vocabulary, metrics=metrics, inputs_field=inputs_field,
                               targets_field=targets_field)
    return name


def text_to_text_task(*, name: str, splits: dict[str, str], vocabulary: str, metrics: tuple[str, ...] = ("accuracy",),
                      inputs_field: str = "inputs", targets_field: str = "targets") -> str:
    """Registers the text-to-text task `name` once and returns its name (for gin)."""
    return _registered(name, tuple(sorted(splits.items())), vocabulary, tuple(metrics), inputs_field, targets_field)
