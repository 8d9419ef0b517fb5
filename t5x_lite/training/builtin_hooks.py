"""The train loop's own hooks: metric reports, epoch lines, evaluations, samples, checkpoints.

Each is a `hooks.Hook` like a user's; `builtin_hooks` builds a run's, in their order. What one
tells the others goes on `info.latest` (hooks.Latest): StepMetrics writes the latest train
report, Evaluation the latest validation loss, Checkpoints the step saved last.
"""

from __future__ import annotations

import shlex
import time
from typing import Any, Callable, Sequence

import jax

from t5x_lite.checkpoints import checkpoint as checkpoint_lib
from t5x_lite.checkpoints import lease as lease_lib
from t5x_lite.data import iterators, task_access
from t5x_lite.data.task_access import DataConfig
from t5x_lite.data.vocab import tokenizer_files
from t5x_lite.errors import UserError
from t5x_lite.evaluation import eval_loop
from t5x_lite.inference import sample
from t5x_lite.metrics.writer import MetricsWriter
from t5x_lite.models import BaseModel
from t5x_lite.parallel.placement import Placement
from t5x_lite.training import reporting, validation
from t5x_lite.training.hooks import Hook, StepInfo
from t5x_lite.training.periods import Period
from t5x_lite.training.run_spec import RunSpec
from t5x_lite.training.trainer import Trainer


class NonFiniteLossError(UserError, FloatingPointError):
    """The loss or gradients became NaN/Inf; the run stopped before saving the state."""


def check_finite(flags: Sequence[jax.Array], *, last_step: int, saved_step: int | None) -> None:
    """Stops the run if one of `flags` (the `nonfinite_steps` of the steps up to `last_step`) is set."""
    if not flags:
        return
    values = jax.device_get(list(flags))
    first_bad = next((last_step - len(values) + i + 1 for i, bad in enumerate(values) if bad), None)
    if first_bad is not None:
        kept = f"the last checkpoint (step {saved_step}) is untouched" if saved_step else "no checkpoint was written"
        raise NonFiniteLossError(
            f"The loss or gradients became NaN/Inf at step {first_bad}; the run stopped before saving "
            f"that state ({kept}). Lower the learning rate, enable clipping, check the data, or set "
            "--gin.train.on_nonfinite=\"'skip'\" to skip such steps.")


class StepMetrics(Hook):
    """Every step: keeps the step's metrics (on the device). Every `log_period` steps and after the
    last: reports them (reading them syncs with the device), after checking that no step went NaN/Inf
    (`stop_on_nonfinite`). Writes `info.latest.train`."""

    def __init__(self, *, writer: MetricsWriter, log_period: int, tokens_per_step: int, flops_per_token: float,
                 peak_flops_per_device: float | None, stop_on_nonfinite: bool):
        super().__init__(every=1)
        self.writer, self.log_period = writer, log_period
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
        self.peak_flops_per_device, self.stop_on_nonfinite = peak_flops_per_device, stop_on_nonfinite
        self.window: list[dict[str, jax.Array]] = []
        self.window_start = time.perf_counter()

    def run(self, info: StepInfo) -> None:
        self.window.append(info.metrics)
        if info.step % self.log_period == 0 or info.final:
            self.report(info)

    def at_end(self, info: StepInfo) -> None:
        if self.window:
            self.report(info)

    def report(self, info: StepInfo) -> None:
        if self.stop_on_nonfinite:
            check_finite([m["nonfinite_steps"] for m in self.window], last_step=info.step,
                         saved_step=info.latest.saved_step)
        summary = reporting.summarize_window(
            jax.device_get(self.window), seconds=time.perf_counter() - self.window_start,
            tokens_per_step=self.tokens_per_step, flops_per_token=self.flops_per_token,
            peak_flops_per_device=self.peak_flops_per_device, num_devices=jax.device_count())
        info.latest.train, info.latest.train_step = summary, info.step
        self.writer.scalars("train", info.step, summary)
        self.writer.progress(info.step, {name: summary[key] for name, key in reporting.SHOWN_METRICS if key in summary})
        self.window, self.window_start = [], time.perf_counter()


class EpochLog(Hook):
    """Every step that ends an epoch: prints what the epoch read."""

    def __init__(self, *, writer: MetricsWriter, iterator: iterators.DataIterator):
        super().__init__(every=1)
        self.writer, self.iterator = writer, iterator

    def run(self, info: StepInfo) -> None:
        if info.end_of_epoch:
            self.writer.print(f"epoch {info.epochs_finished} finished at step {info.step}: "
                              + reporting.describe_epoch_stats(self.iterator.last_epoch_stats))


class Evaluation(Hook):
    """Every `every` (train.eval_period) and after the last step: the validation loss, then each
    multiple-choice set. Writes `info.latest.eval`."""

    def __init__(self, *, every: int | str, writer: MetricsWriter, trainer: Trainer, data: DataConfig,
                 max_batches: int | None, model: BaseModel, multiple_choice: Sequence[eval_loop.MultipleChoiceEval],
                 encode: Callable[[str], list[int]], placement: Placement, bos_id: int = 0):
        super().__init__(every=every)
        self.writer, self.trainer, self.data, self.max_batches = writer, trainer, data, max_batches
        self.model, self.multiple_choice, self.encode = model, multiple_choice, encode
        self.placement, self.bos_id = placement, bos_id  # bos_id: the model's first token (multiple choice)

    def run(self, info: StepInfo) -> None:
        step, params = info.step, info.state.params
        loss = validation.validation_loss(self.trainer, params, self.data, max_batches=self.max_batches)
        info.latest.eval, info.latest.eval_step = loss, step
        self.writer.scalars("eval", step, loss)
        self.writer.print(f"step {step}: validation loss {loss['loss']:.4f}, perplexity "
                          f"{loss['perplexity']:.2f} ({int(loss['tokens'])} tokens)")
        for mc in self.multiple_choice:
            scores = eval_loop.score_multiple_choice_set(mc, model=self.model, params=params, encode=self.encode,
                                                         placement=self.placement, bos_id=self.bos_id)
            self.writer.scalars(mc.name, step, scores)
            self.writer.print(f"step {step}: {mc.name} acc {scores['acc']:.4f}, acc_norm {scores['acc_norm']:.4f} "
                              f"({int(scores['examples'])} examples)")

    def at_end(self, info: StepInfo) -> None:
        if info.latest.eval_step != info.step:  # a run that resumed at its limit: no step ran
            self.run(info)


class Samples(Hook):
    """Every `every` (each evaluation's period; 0 without one) and after the last step: sampled
    continuations of the prompts, with the `t5x-lite sample` command that prints them again."""

    def __init__(self, *, every: int | str, writer: MetricsWriter, model: BaseModel, vocabulary: Any,
                 prompts: Sequence[str], max_new_tokens: int, seed: int, placement: Placement):
        super().__init__(every=every)
        self.writer, self.model, self.vocabulary, self.prompts = writer, model, vocabulary, list(prompts)
        self.max_new_tokens, self.seed, self.placement = max_new_tokens, seed, placement
        self.shown_at: int | None = None

    def run(self, info: StepInfo) -> None:
        self.shown_at = info.step
        # Every process decodes (a collective over the mesh); the writer prints on process 0.
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
        if self.shown_at != info.step:  # a run that resumed at its limit: no step ran
            self.run(info)


class Checkpoints(Hook):
    """Every step: reports the saves that finished in the background. Every `period`, after the last
    step and when the run is asked to stop: saves the train state, the data iterator's position and
    the latest metrics, once every step up to it is known finite. Writes `info.latest.saved_step`."""

    def __init__(self, *, writer: MetricsWriter, checkpointer: checkpoint_lib.Checkpointer, period: Period,
                 dropout_rng: jax.Array, iterator: iterators.DataIterator, metadata: dict, config_text: str,
                 async_save: bool, stop_on_nonfinite: bool, lease: lease_lib.Lease | None = None):
        super().__init__(every=1)
        self.writer, self.checkpointer, self.period = writer, checkpointer, period
        self.dropout_rng, self.iterator, self.metadata, self.config_text = dropout_rng, iterator, metadata, config_text
        self.async_save, self.stop_on_nonfinite = async_save, stop_on_nonfinite
        self.lease = lease  # None on processes other than the chief
        self._started: dict[int, float] = {}  # when each save in flight began
        self._unchecked: list[jax.Array] = []  # nonfinite_steps of the steps since the latest train report

    def run(self, info: StepInfo) -> None:
        self._report(self.checkpointer.poll())  # a background save that finished (or failed)
        if self.stop_on_nonfinite:
            self._unchecked.append(info.metrics["nonfinite_steps"])
            if info.latest.train_step == info.step:  # StepMetrics (before this hook) checked them all
                self._unchecked.clear()
        if info.due(self.period) or info.final:
            self.save(info)

    def at_end(self, info: StepInfo) -> None:
        self.save_and_wait(info)

    def save_and_wait(self, info: StepInfo) -> None:
        """Saves this step unless it is saved already, and waits until every write is committed."""
        if info.latest.saved_step != info.step:
            self.save(info)
        self._report(self.checkpointer.wait())

    def save(self, info: StepInfo) -> None:
        step, latest = info.step, info.latest
        check_finite(self._unchecked, last_step=step, saved_step=latest.saved_step)
        self._unchecked.clear()
        metrics = {f"eval/{k}": v for k, v in latest.eval.items()} if latest.eval_step == step else {}
        if latest.train:
            metrics["train/loss"] = latest.train["loss"]
        if self.lease is not None:
            self.lease.check()  # stops the run if another took the directory over (a forced unlock)
        self._started[step] = time.perf_counter()
        blocked = self.checkpointer.save(step, state=checkpoint_lib.to_saveable(info.state, self.dropout_rng),
                                         iterator_state=self.iterator.get_state(), metadata=self.metadata,
                                         config_text=self.config_text, metrics=metrics)
        latest.saved_step = step
        if self.async_save:
            self.writer.print(f"step {step}: saving a checkpoint in the background (loop blocked {blocked:.2f} s)")
        self._report(self.checkpointer.poll())  # a synchronous save is committed already

    def _report(self, committed: list[int]) -> None:
        """"checkpoint saved" only for steps whose save is committed (files written, manifest last)."""
        where = checkpoint_lib.checkpoints_dir(self.checkpointer.model_dir)
        for step in committed:
            took = time.perf_counter() - self._started.pop(step, time.perf_counter())
            self.writer.print(f"step {step}: checkpoint saved in {where} (committed {took:.2f} s after the save began)")


def builtin_hooks(*, spec: RunSpec, writer: MetricsWriter, trainer: Trainer, placement: Placement,
                  iterator: iterators.DataIterator, checkpointer: checkpoint_lib.Checkpointer,
                  lease: lease_lib.Lease | None, dropout_rng: jax.Array, metadata: dict, config_text: str,
                  stop_on_nonfinite: bool, log_period: int, eval_period: int | str, eval_batches: int | None,
                  multiple_choice: Sequence[eval_loop.MultipleChoiceEval], sample_prompt: str | Sequence[str] | None,
                  sample_max_new_tokens: int, seed: int, checkpoint_every: Period,
                  async_checkpoints: bool) -> tuple[list[Hook], Checkpoints]:
    """A run's built-in hooks in their order, and among them Checkpoints (the loop saves through it
    when the run is asked to stop). The arguments are train's (loop.py) and what it built."""
    model, train_data, eval_data = spec.model, spec.train_data, spec.eval_data
    vocabulary = task_access.targets_vocabulary(train_data)
    prompts = sample.prompt_list(sample_prompt)
    if prompts and not model.continues_text:
        writer.print("samples skipped: sampling during training supports decoder-only models")
        prompts = []
    step_metrics = StepMetrics(
        writer=writer, log_period=log_period, tokens_per_step=train_data.batch_size * train_data.sequence_length,
        flops_per_token=model.train_flops_per_token(targets_length=train_data.sequence_length,
                                                    inputs_length=train_data.inputs_length),
        peak_flops_per_device=spec.peak_flops_per_device, stop_on_nonfinite=stop_on_nonfinite)
    evaluation = [] if eval_data is None else [Evaluation(
        every=eval_period, writer=writer, trainer=trainer, data=eval_data, max_batches=eval_batches, model=model,
        multiple_choice=multiple_choice, encode=lambda text: list(vocabulary.encode(text)), placement=placement,
        bos_id=tokenizer_files.decoder_start_id(vocabulary))]
    samples = [] if not prompts else [Samples(
        every=eval_period if evaluation else 0, writer=writer, model=model, vocabulary=vocabulary, prompts=prompts,
        max_new_tokens=sample_max_new_tokens, seed=seed, placement=placement)]
    checkpoints = Checkpoints(writer=writer, checkpointer=checkpointer, period=checkpoint_every,
                              dropout_rng=dropout_rng, iterator=iterator, metadata=metadata, config_text=config_text,
                              async_save=async_checkpoints, stop_on_nonfinite=stop_on_nonfinite, lease=lease)
    # Reports first (they check for NaN/Inf); an evaluation before the checkpoint of the same step, which records it.
    return [step_metrics, EpochLog(writer=writer, iterator=iterator), *evaluation, *samples, checkpoints], checkpoints
