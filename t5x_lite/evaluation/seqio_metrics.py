"""SeqIO evaluation: a task's `metric_fns` on a restored model's predictions and scores.

`seqio.Evaluator` reads the split once and caches it; each call of `SeqioEvaluation.run`
predicts (for prediction metrics such as accuracy, BLEU, ROUGE) and scores (for score
metrics) with the model of one checkpoint, and seqio computes the metrics and logs them:
TensorBoard summaries under LOG_DIR/<task>/, `<task>-metrics.jsonl` (one line per step) and
the inputs, targets and predictions of each step in `<task>-<step>.jsonl`.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import numpy as np

from t5x_lite import storage
from t5x_lite.checkpoints.restored_model import RestoredModel
from t5x_lite.data import task_access
from t5x_lite.data.vocab import tokenizer_files
from t5x_lite.errors import TaskDataError
from t5x_lite.inference import predict
from t5x_lite.tf_setup import import_tensorflow


@functools.cache
def unpadded_feature_converter_class() -> type:
    """A converter that hands the task's examples (token ids of any length) to the model functions unchanged.

    The decoding functions pad and batch prompts themselves; seqio's Evaluator only needs to
    know which features are the task's (to measure their lengths) and that nothing is packed.
    Built on first use: seqio and TensorFlow load only when a SeqIO evaluation is asked for,
    so registering the configurables (every gin parse) stays free of them.
    """
    tf = import_tensorflow()
    import seqio

    class UnpaddedFeatureConverter(seqio.PassThroughFeatureConverter):
        TASK_FEATURES = {"inputs": seqio.FeatureConverter.FeatureSpec(dtype=tf.int32),
                         "targets": seqio.FeatureConverter.FeatureSpec(dtype=tf.int32)}
        pack = False

    return UnpaddedFeatureConverter


class SeqioEvaluation:
    """One task's (or mixture's) evaluation split, evaluated with each checkpoint given to `run`.

    Every process reads the split and decodes its share of each batch on the checkpoint's mesh;
    the predictions are combined on every process, and process 0 alone computes the metrics
    and writes seqio's logs.
    """

    def __init__(self, *, mixture_or_task_name: str, split: str, log_dir: str, num_examples: int | None,
                 batch_size: int, decoding_config: predict.DecodingConfig):
        self.name = mixture_or_task_name
        self.split = split
        self.batch_size = batch_size
        self.decoding_config = decoding_config
        self.chief = jax.process_index() == 0
        task_access.get_task(mixture_or_task_name)  # registered in seqio (or the extra to install named)
        import seqio  # with TensorFlow, loaded only when a SeqIO evaluation is asked for

        if self.chief:
            storage.makedirs(log_dir)  # seqio's JSON logger writes into it without creating it
        try:
            self.evaluator = seqio.Evaluator(
                mixture_or_task_name=mixture_or_task_name, feature_converter=unpadded_feature_converter_class()(),
                eval_split=split, num_examples=num_examples,
                logger_cls=(seqio.JSONLogger, seqio.TensorBoardLogger) if self.chief else (),
                log_dir=log_dir, use_memory_cache=True)
        except (ValueError, KeyError) as e:
            raise TaskDataError(f"SeqIO evaluation of {mixture_or_task_name!r} ({split} split) cannot start: {e}") from None
        if not self.evaluator.eval_tasks:
            raise TaskDataError(f"{mixture_or_task_name!r} has no task with metric_fns and a {split!r} split; "
                                "register one with metrics (for example t5x_lite/data/tasks/text_to_text.py) to evaluate it.")

    def run(self, restored: RestoredModel) -> dict[str, dict[str, float]]:
        """{task name: {metric: value}} of this checkpoint ({} on processes other than 0); seqio's
        loggers write them as well."""
        for task in self.evaluator.eval_tasks:
            if not any(True for _ in self.evaluator.cached_model_datasets[task.name].take(1)):
                raise TaskDataError(f"The {self.split!r} split of {task.name!r} is empty; nothing to evaluate.")
        # A mixture's tasks share one vocabulary (seqio requires it of mixtures).
        vocabulary = self.evaluator.eval_tasks[0].output_features["targets"].vocabulary
        # seqio calls each function only when one of a task's metrics needs its output; every
        # process calls the same ones (each is a collective over the mesh).
        metrics_future, _ = self.evaluator.evaluate(
            compute_metrics=self.chief, step=restored.step,
            predict_fn=lambda ds: self._predict(restored, _numpy(ds), vocabulary=vocabulary),
            score_fn=lambda ds: self._score(restored, _numpy(ds), vocabulary=vocabulary),
            predict_with_aux_fn=lambda ds: self._predict_with_aux(restored, _numpy(ds), vocabulary=vocabulary))
        return _plain(metrics_future.result() or {})

    def _generate(self, restored: RestoredModel, examples: list[tuple[int, dict]], *,
                  vocabulary: Any) -> tuple[list[list[int]], list[list[int]]]:
        """(prompts as the model reads them, generated token ids) of the examples."""
        prompts = [predict.fit_prompt(restored.config, example["inputs"].tolist(),
                                      self.decoding_config.max_decode_length) for _, example in examples]
        outputs = predict.predict(model=restored.config, params=restored.params, prompts=prompts,
                                  decoding_config=self.decoding_config, eos_id=vocabulary.eos_id,
                                  batch_size=self.batch_size, placement=restored.placement,
                                  bos_id=tokenizer_files.decoder_start_id(vocabulary),
                                  zero_is_token=tokenizer_files.zero_is_token(vocabulary))
        return prompts, outputs

    def _predict(self, restored: RestoredModel, examples: list[tuple[int, dict]], *, vocabulary: Any):
        """[(index, prediction)]: each prediction's token ids, padded to one length."""
        _, outputs = self._generate(restored, examples, vocabulary=vocabulary)
        return _indexed(examples, pad_predictions(outputs, eos_id=vocabulary.eos_id))

    def _predict_with_aux(self, restored: RestoredModel, examples: list[tuple[int, dict]], *, vocabulary: Any):
        """`_predict`'s pairs and {"scores": [...]}: the model's log-likelihood of each prediction
        given its inputs."""
        prompts, outputs = self._generate(restored, examples, vocabulary=vocabulary)
        scores = predict.score(model=restored.config, params=restored.params, batch_size=self.batch_size,
                               pairs=[(p, t or [vocabulary.eos_id]) for p, t in zip(prompts, outputs)],
                               placement=restored.placement, bos_id=tokenizer_files.decoder_start_id(vocabulary))
        return _indexed(examples, pad_predictions(outputs, eos_id=vocabulary.eos_id)), {"scores": scores}

    def _score(self, restored: RestoredModel, examples: list[tuple[int, dict]], *, vocabulary: Any):
        pairs = [(example["inputs"].tolist(), example["targets"].tolist()) for _, example in examples]
        scores = predict.score(model=restored.config, params=restored.params, pairs=pairs, batch_size=self.batch_size,
                               placement=restored.placement, bos_id=tokenizer_files.decoder_start_id(vocabulary))
        return _indexed(examples, scores)

    def close(self) -> None:
        self.evaluator.close()


def pad_predictions(predictions: Sequence[Sequence[int]], *, eos_id: int | None) -> list[list[int]]:
    """Predictions of different lengths (each stops at its EOS) padded to one length with EOS.

    seqio's Evaluator turns a task's predictions into one numpy array, which ragged lists cannot
    be; `Vocabulary.decode` reads up to the first EOS, so the padding never reaches the text.
    """
    longest = max((len(p) for p in predictions), default=0)
    fill = 0 if eos_id is None else eos_id
    return [list(p) + [fill] * (longest + 1 - len(p)) for p in predictions]


def _numpy(dataset) -> list[tuple[int, dict]]:
    """The enumerated (index, example) pairs of seqio's cached dataset (a tf.data.Dataset), as numpy."""
    return list(dataset.as_numpy_iterator())


def _indexed(examples: list[tuple[int, dict]], outputs: Sequence[Any]) -> list[tuple[int, Any]]:
    """(seqio's example index, output) pairs: how seqio's Evaluator matches outputs to examples."""
    return [(index, output) for (index, _), output in zip(examples, outputs)]


def _plain(all_metrics: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """seqio's metric values (numpy scalars or clu Scalar objects) as floats."""
    plain = {}
    for task, values in all_metrics.items():
        plain[task] = {}
        for name, value in values.items():
            value = getattr(value, "value", value)
            if np.ndim(value) == 0:
                plain[task][name] = float(value)
    return plain
