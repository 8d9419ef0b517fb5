"""What the train loop does beside stepping, as hooks: metric reports, evaluations, samples, checkpoints.

The loop calls `after_step(info, step_metrics)` of each hook after every step, in order, and
`at_end(info)` once when it stops; a hook decides for itself whether it is due. The order
matters once: an evaluation comes before the checkpoint of the same step, which records it.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from typing import Any, Callable, Sequence

import jax

from t5x_lite.checkpoints import checkpoint as checkpoint_lib
from t5x_lite.checkpoints import lease as lease_lib
from t5x_lite.data import input_pipeline
from t5x_lite.data.task_access import DataConfig
from t5x_lite.errors import UserError
from t5x_lite.evaluation import eval_loop
from t5x_lite.inference import sample
from t5x_lite.metrics.writer import MetricsWriter
from t5x_lite.models import ModelConfig
from t5x_lite.parallel.placement import Placement
from t5x_lite.training import reporting, validation
from t5x_lite.training.periods import Period
from t5x_lite.training.trainer import Trainer, TrainState


class NonFiniteLossError(UserError, FloatingPointError):
    """The loss or gradients became NaN/Inf; the run stopped before saving the state."""


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """Where the loop stands after a step: what every hook is given."""

    step: int
    state: TrainState
    epochs_finished: int
    end_of_epoch: bool
    final: bool  # the step or epoch limit is reached: the run ends after this step

    def due(self, period: Period) -> bool:
        return period.due(step=self.step, epochs_finished=self.epochs_finished, end_of_epoch=self.end_of_epoch)


class Hook:
    """Something the loop does beside stepping; each method does nothing unless a hook overrides it."""

    def after_step(self, info: StepInfo, step_metrics: dict[str, jax.Array]) -> None:
        """Called after every step, in the order of the loop's hooks."""

    def at_end(self, info: StepInfo) -> None:
        """Called once when the loop stops at its step or epoch limit (not when it is preempted)."""


class StepMetrics(Hook):
    """Collects each step's metrics on the device and reports them every `log_period` steps.

    Reading them syncs with the device, so it happens only at reports (and before a save, to
    check that no step since the last check went NaN/Inf).
    """

    def __init__(self, *, writer: MetricsWriter, log_period: int, train_steps: int | None, tokens_per_step: int,
                 flops_per_token: float, peak_flops_per_device: float | None, stop_on_nonfinite: bool):
        self.writer, self.log_period, self.train_steps = writer, log_period, train_steps
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
        self.peak_flops_per_device, self.stop_on_nonfinite = peak_flops_per_device, stop_on_nonfinite
        self.window: list[dict[str, jax.Array]] = []
        self.window_start = time.perf_counter()
        self.checked = 0  # window entries already checked for non-finite steps
        self.last: dict[str, float] = {}  # the latest report
        self.last_saved: int | None = None  # set by Checkpoints; named when a step goes non-finite

    def after_step(self, info: StepInfo, step_metrics: dict[str, jax.Array]) -> None:
        self.window.append(step_metrics)
        if info.step % self.log_period == 0 or info.step == self.train_steps:
            self.report(info.step)

    def at_end(self, info: StepInfo) -> None:
        if self.window:
            self.report(info.step)

    def report(self, step: int) -> None:
        self.check_finite(step)
        self.last = reporting.summarize_window(
            jax.device_get(self.window), seconds=time.perf_counter() - self.window_start,
            tokens_per_step=self.tokens_per_step, flops_per_token=self.flops_per_token,
            peak_flops_per_device=self.peak_flops_per_device, num_devices=jax.device_count())
        self.writer.scalars("train", step, self.last)
        self.writer.progress(step, {name: self.last[key] for name, key in reporting.SHOWN_METRICS if key in self.last})
        self.window, self.window_start, self.checked = [], time.perf_counter(), 0

    def check_finite(self, step: int) -> None:
        """Stops the run (on_nonfinite='stop') if a step since the last check was NaN/Inf."""
        if not self.stop_on_nonfinite or len(self.window) == self.checked:
            return
        flags = jax.device_get([m["nonfinite_steps"] for m in self.window[self.checked:]])
        first_bad = next((step - len(self.window) + self.checked + i + 1 for i, f in enumerate(flags) if f), None)
        self.checked = len(self.window)
        if first_bad is not None:
            kept = (f"the last checkpoint (step {self.last_saved}) is untouched" if self.last_saved
                    else "no checkpoint was written")
            raise NonFiniteLossError(
                f"The loss or gradients became NaN/Inf at step {first_bad}; the run stopped before saving "
                f"that state ({kept}). Lower the learning rate, enable clipping, check the data, or set "
                "--gin.train.on_nonfinite=\"'skip'\" to skip such steps.")


class EpochLog(Hook):
    """Prints what each finished epoch read."""

    def __init__(self, *, writer: MetricsWriter, iterator: input_pipeline.BatchIterator):
        self.writer, self.iterator = writer, iterator

    def after_step(self, info: StepInfo, step_metrics: dict[str, jax.Array]) -> None:
        if info.end_of_epoch:
            self.writer.print(f"epoch {info.epochs_finished} finished at step {info.step}: "
                              + reporting.describe_epoch_stats(self.iterator.last_epoch_stats))


class Samples(Hook):
    """Sampled continuations of the prompts, printed at each evaluation (or, without one, at the end)."""

    def __init__(self, *, writer: MetricsWriter, model: ModelConfig, vocabulary: Any, prompts: Sequence[str],
                 max_new_tokens: int, seed: int, at_end_too: bool, placement: Placement):
        self.writer, self.model, self.vocabulary, self.prompts = writer, model, vocabulary, list(prompts)
        self.max_new_tokens, self.seed, self.at_end_too = max_new_tokens, seed, at_end_too
        self.placement = placement

    def show(self, info: StepInfo) -> None:
        if not self.prompts:  # every process decodes (a collective over the mesh); the writer prints on process 0
            return
        seed = self.seed + info.step
        texts = sample.sample_texts(model=self.model, params=info.state.params, vocabulary=self.vocabulary,
                                    prompts=self.prompts, max_new_tokens=self.max_new_tokens, seed=seed,
                                    placement=self.placement)
        # sample_texts' defaults (temperature 0.8, top_k 40) are `t5x-lite sample`'s too.
        command = (f"t5x-lite sample --step={info.step} --seed={seed} --max_new_tokens={self.max_new_tokens} "
                   + " ".join(f"--prompt={shlex.quote(p)}" for p in self.prompts))
        self.writer.print(f"step {info.step} samples ({command} prints the same):"
                          + "".join(f"\n--- {p!r}\n{t}" for p, t in zip(self.prompts, texts)))

    def at_end(self, info: StepInfo) -> None:
        if self.at_end_too:
            self.show(info)


class Evaluation(Hook):
    """The validation loss, multiple-choice sets and samples, every `period` and after the last step."""

    def __init__(self, *, writer: MetricsWriter, trainer: Trainer, data: DataConfig, period: Period,
                 train_steps: int | None, max_batches: int | None, model: ModelConfig,
                 multiple_choice: Sequence[eval_loop.MultipleChoiceEval], encode: Callable[[str], list[int]],
                 samples: Samples, placement: Placement, bos_id: int = 0):
        self.writer, self.trainer, self.data, self.period, self.max_batches = writer, trainer, data, period, max_batches
        self.train_steps = train_steps
        self.model, self.multiple_choice, self.encode, self.samples = model, multiple_choice, encode, samples
        self.placement, self.bos_id = placement, bos_id  # bos_id: the model's first token (multiple choice)
        self.last: dict[str, float] = {}
        self.evaluated_at: int | None = None

    def after_step(self, info: StepInfo, step_metrics: dict[str, jax.Array]) -> None:
        if info.due(self.period) or info.step == self.train_steps:
            self.run(info)

    def at_end(self, info: StepInfo) -> None:
        if self.evaluated_at != info.step:
            self.run(info)

    def run(self, info: StepInfo) -> None:
        step, params = info.step, info.state.params
        self.last = validation.validation_loss(self.trainer, params, self.data, max_batches=self.max_batches)
        self.writer.scalars("eval", step, self.last)
        self.writer.print(f"step {step}: validation loss {self.last['loss']:.4f}, perplexity "
                          f"{self.last['perplexity']:.2f} ({int(self.last['tokens'])} tokens)")
        for mc in self.multiple_choice:
            scores = eval_loop.score_multiple_choice_set(mc, model=self.model, params=params, encode=self.encode,
                                                         placement=self.placement, bos_id=self.bos_id)
            self.writer.scalars(mc.name, step, scores)
            self.writer.print(f"step {step}: {mc.name} acc {scores['acc']:.4f}, acc_norm {scores['acc_norm']:.4f} "
                              f"({int(scores['examples'])} examples)")
        self.samples.show(info)
        self.evaluated_at = step


class Checkpoints(Hook):
    """Saves the train state, the data iterator's position and the latest metrics every `period`,
    after the last step, and when the run is asked to stop."""

    def __init__(self, *, writer: MetricsWriter, checkpointer: checkpoint_lib.Checkpointer, period: Period,
                 dropout_rng: jax.Array, iterator: input_pipeline.BatchIterator, metadata: dict, config_text: str,
                 async_save: bool, step_metrics: StepMetrics, evaluation: Evaluation | None, last_saved: int | None,
                 lease: lease_lib.Lease | None = None):
        self.writer, self.checkpointer, self.period = writer, checkpointer, period
        self.dropout_rng, self.iterator, self.metadata, self.config_text = dropout_rng, iterator, metadata, config_text
        self.async_save, self.step_metrics, self.evaluation = async_save, step_metrics, evaluation
        self._started: dict[int, float] = {}  # when each save in flight began
        self.lease = lease  # None on processes other than the chief
        step_metrics.last_saved = last_saved

    @property
    def last_saved(self) -> int | None:
        """The step saved last (None: none yet); kept where the non-finite check names it."""
        return self.step_metrics.last_saved

    def after_step(self, info: StepInfo, step_metrics: dict[str, jax.Array]) -> None:
        self._report(self.checkpointer.poll())  # a background save that finished (or failed)
        if info.due(self.period):
            self.save(info)

    def at_end(self, info: StepInfo) -> None:
        self.save_and_wait(info)

    def save_and_wait(self, info: StepInfo) -> None:
        """Saves this step unless it is saved already, and waits until every write is committed."""
        if self.last_saved != info.step:
            self.save(info)
        self._report(self.checkpointer.wait())

    def _report(self, committed: list[int]) -> None:
        """"checkpoint saved" only for steps whose save is committed (files written, manifest last)."""
        where = checkpoint_lib.checkpoints_dir(self.checkpointer.model_dir)
        for step in committed:
            took = time.perf_counter() - self._started.pop(step, time.perf_counter())
            self.writer.print(f"step {step}: checkpoint saved in {where} (committed {took:.2f} s after the save began)")

    def save(self, info: StepInfo) -> None:
        step = info.step
        self.step_metrics.check_finite(step)
        evaluation = self.evaluation
        saved_metrics = ({f"eval/{k}": v for k, v in evaluation.last.items()}
                         if evaluation and evaluation.evaluated_at == step else {})
        if self.step_metrics.last:
            saved_metrics["train/loss"] = self.step_metrics.last["loss"]
        if self.lease is not None:
            self.lease.check()  # stops the run if another took the directory over (a forced unlock)
        self._started[step] = time.perf_counter()
        blocked = self.checkpointer.save(step, state=checkpoint_lib.to_saveable(info.state, self.dropout_rng),
                                         iterator_state=self.iterator.get_state(), metadata=self.metadata,
                                         config_text=self.config_text, metrics=saved_metrics)
        self.step_metrics.last_saved = step
        if self.async_save:
            self.writer.print(f"step {step}: saving a checkpoint in the background (loop blocked {blocked:.2f} s)")
        self._report(self.checkpointer.poll())  # a synchronous save is committed already
