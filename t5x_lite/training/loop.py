"""The train loop: validate, build, restore or initialise, then step / eval / checkpoint.

Everything the run needs arrives as keyword arguments, bound by gin (see gin/runs/).
"""

from __future__ import annotations

import json
import time
from typing import Any, Sequence

import jax
import numpy as np

import gin
from t5x_lite import storage
from t5x_lite.checkpoints import checkpoint as checkpoint_lib
from t5x_lite.checkpoints import init_from as init_from_lib
from t5x_lite.checkpoints.retention import RetentionPolicy
from t5x_lite.data import input_pipeline, task_modules
from t5x_lite.data import task_access as data_lib
from t5x_lite.errors import ConfigValueError, RunConfigError, UserError
from t5x_lite.evaluation import eval_loop
from t5x_lite.inference import sample
from t5x_lite.metrics import writer as metrics
from t5x_lite.models import ModelConfig, stack, train_flops_per_token
from t5x_lite.parallel import distributed, partitioning
from t5x_lite.training import profiling, reporting, validation
from t5x_lite.training import trainer as trainer_lib
from t5x_lite.training.optim import OptimizerConfig
from t5x_lite.training.periods import parse_period
from t5x_lite.training.preemption import Preempted, PreemptionWatcher


class NonFiniteLossError(UserError, FloatingPointError):
    """The loss or gradients became NaN/Inf; the run stopped before saving the state."""


ON_NONFINITE = ("stop", "skip")


def _validate(*, model: ModelConfig, train_data: data_lib.DataConfig,
              eval_data: data_lib.DataConfig | None, train_steps: int | None, num_epochs: int | None,
              microbatches: int, batch_shards: int) -> int:
    """Checks sizes against each other and the data; returns the vocabulary size."""
    if train_steps is None and num_epochs is None:
        raise RunConfigError("Set TRAIN_STEPS or train.num_epochs (or both: the run stops at the first).")
    stack.check_backend_supports(model.remat_policy)
    for cfg in filter(None, (train_data, eval_data)):
        if model.family == "decoder_only" and cfg.sequence_length > model.max_len:
            raise RunConfigError(
                f"{cfg.split} sequence_length={cfg.sequence_length} does not fit the model's "
                f"max_len={model.max_len}; lower the sequence length or raise DecoderConfig.max_len."
            )
        if cfg.batch_size % jax.process_count():
            raise RunConfigError(f"batch_size={cfg.batch_size} must divide over {jax.process_count()} processes.")
        if cfg.batch_size % batch_shards:
            raise RunConfigError(
                f"{cfg.split} batch_size={cfg.batch_size} must be a multiple of the {batch_shards} "
                "batch shards of the mesh; change the batch size or the mesh."
            )
    if train_data.batch_size % (microbatches * batch_shards):
        raise RunConfigError(
            f"batch_size={train_data.batch_size} must be a multiple of microbatches x batch shards "
            f"= {microbatches} x {batch_shards}."
        )
    vocab_size = data_lib.vocabulary_size(train_data)
    if not vocab_size <= model.vocab_size < _round_up(vocab_size, 128) + 1:
        name = type(model).__name__
        raise RunConfigError(
            f"The task's vocabulary has {vocab_size} entries but {name}.vocab_size="
            f"{model.vocab_size}; set --gin.{name}.vocab_size={vocab_size} (or up to "
            f"{_round_up(vocab_size, 128)}, padded to a multiple of 128)."
        )
    return vocab_size


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def run_metadata(*, model: ModelConfig, train_data: data_lib.DataConfig, vocab_size: int,
                 mesh_axes: Any) -> dict:
    """What `checkpoint info` shows and what a resumed run is checked against."""
    return {
        "family": model.family,
        # Through JSON, so it compares equal to what a checkpoint's metadata reads back (lists, not tuples).
        "model": json.loads(json.dumps(model.to_dict())),
        "task": train_data.mixture_or_task_name,
        "vocab_size": vocab_size,
        "sequence_length": train_data.sequence_length,
        "mesh_axes": [list(a) for a in (mesh_axes.items() if isinstance(mesh_axes, dict) else mesh_axes)],
        "num_params": model.num_params(),
    }


def _write_config(work_dir: str, config_text: str, vocabulary_file: str | None) -> None:
    """config.gin and vocab/ of the run (in an s3 run's staging directory: uploaded with checkpoints)."""
    storage.makedirs(work_dir)
    storage.write_whole(storage.join(work_dir, "config.gin"), config_text)
    if vocabulary_file:
        storage.makedirs(storage.join(work_dir, "vocab"))
        storage.copy(vocabulary_file, storage.join(work_dir, "vocab", "spm.model"))


def train(
    *,
    model_dir: str,
    model: ModelConfig,
    train_data: data_lib.DataConfig,
    eval_data: data_lib.DataConfig | None = None,
    optimizer: OptimizerConfig = OptimizerConfig(),
    loss: trainer_lib.LossConfig = trainer_lib.LossConfig(),
    mesh_axes: Sequence[tuple[str, int]] = (("data", -1), ("fsdp", 1), ("tensor", 1)),
    logical_axis_rules: partitioning.LogicalRules = partitioning.DEFAULT_RULES,
    train_steps: int | None = None,
    num_epochs: int | None = None,
    microbatches: int = 1,
    eval_period: int | str = 0,
    eval_batches: int | None = None,
    checkpoint_period: int | str = 0,
    retention: RetentionPolicy = RetentionPolicy(),
    async_checkpoints: bool = True,
    init_from: init_from_lib.InitFrom | None = None,
    on_nonfinite: str = "stop",
    log_period: int = 10,
    seed: int = 0,
    peak_flops_per_device: float | None = None,
    init_loss_tolerance: float = 1.0,
    sample_prompt: str | Sequence[str] | None = None,
    sample_max_new_tokens: int = 64,
    multiple_choice: Sequence[eval_loop.MultipleChoiceEval] = (),
    progress_bar: bool | None = None,
    task_module: str | None = None,
    profile_steps: Sequence[int] | None = None,
) -> dict[str, float]:
    """Trains a model (decoder-only or encoder-decoder) and returns the last train and eval metrics.

    Args:
      model_dir: where checkpoints, config.gin and TensorBoard logs go; a run resumes from
        the latest checkpoint found here.
      model: the model's family, sizes and switches (a DecoderConfig or T5Config).
      train_data: the task, split, sequence length and batching of training.
      eval_data: the same for the validation loss at each evaluation (None: no evaluation).
      optimizer: AdamW + schedule + clipping settings.
      loss: z-loss and label smoothing.
      mesh_axes: (axis name, size) pairs; one size may be -1 (all remaining devices).
      logical_axis_rules: (logical axis, mesh axis / tuple of mesh axes / None) pairs.
      train_steps: stop after this many optimizer steps (None: no step limit).
      num_epochs: stop at the end of this many passes over the train split (None: no limit).
      microbatches: split each batch into this many microbatches and accumulate gradients.
      eval_period: evaluate every this many steps (500 or '500 steps') or epochs ('1 epoch');
        0: only at the end.
      eval_batches: evaluate on at most this many batches (None: the whole split).
      checkpoint_period: save every this many steps or epochs (as eval_period); 0: only at the end.
      retention: which checkpoints to keep (last N, every K steps, best by a metric).
      async_checkpoints: write checkpoints in the background (the loop waits only for the
        device-to-host copy); False blocks until each is written.
      init_from: start a new run from another run's parameters (ignored, with a message, when
        model_dir already holds a checkpoint: the run then resumes).
      on_nonfinite: when a step's loss or gradients are NaN/Inf, 'stop' the run (before any
        checkpoint of that state) or 'skip' the step; either way the update is not applied.
      log_period: steps between metric reports (each report syncs with the device).
      seed: seeds parameter init and dropout (the data seed is train_data.seed).
      peak_flops_per_device: peak FLOP/s of one device, for MFU (None: MFU not reported).
      init_loss_tolerance: warn when the step-0 loss is further than this from ln(vocab).
      sample_prompt: a prompt (or a list of prompts) whose sampled continuations are printed at
        every evaluation and after training (decoder-only models; None: no samples).
      sample_max_new_tokens: length of those samples.
      multiple_choice: multiple-choice sets (eval_loop.MultipleChoiceEval, decoder-only models)
        scored at every evaluation; acc and acc_norm go to the log and TensorBoard.
      progress_bar: show a progress bar (None: only when stderr is a terminal).
      task_module: a module to import first that registers the user's own seqio tasks.
      profile_steps: (start, stop): write a jax.profiler trace of the steps from `start` up to
        `stop` to MODEL_DIR/profile/process_<i>/ for TensorBoard (None: no trace; docs/profiling.md).
    """
    if task_module:
        task_modules.import_task_module(task_module)
    model_dir = storage.absolute(model_dir)
    if on_nonfinite not in ON_NONFINITE:
        raise ConfigValueError(f"train.on_nonfinite={on_nonfinite!r}: use one of {ON_NONFINITE}.")
    profiling.check_profile_steps(profile_steps)
    eval_every = parse_period(eval_period, name="train.eval_period")
    checkpoint_every = parse_period(checkpoint_period, name="train.checkpoint_period")
    train_data = train_data.for_model_family(model.family)
    eval_data = eval_data and eval_data.for_model_family(model.family)
    mesh = partitioning.make_mesh(axes=mesh_axes)
    logical_axis_rules = partitioning.rules_for_mesh(logical_axis_rules, mesh)
    batch_shards = partitioning.num_batch_shards(mesh, logical_axis_rules)
    vocab_size = _validate(model=model, train_data=train_data, eval_data=eval_data, train_steps=train_steps,
                           num_epochs=num_epochs, microbatches=microbatches, batch_shards=batch_shards)
    metadata = run_metadata(model=model, train_data=train_data, vocab_size=vocab_size, mesh_axes=mesh_axes)
    if multiple_choice and (model.family != "decoder_only" or eval_data is None):
        raise RunConfigError("train.multiple_choice scores decoder-only models at each evaluation: it needs "
                             "a decoder-only model and train.eval_data.")
    is_chief = distributed.is_chief()

    # Decide what to start from before anything is written to the model directory.
    existing = checkpoint_lib.Checkpointer(model_dir, create=False)
    latest = existing.latest_step()
    for step in reversed(existing.all_steps()):
        try:
            saved_metadata = existing.metadata(step)
        except Exception:  # noqa: BLE001 - a damaged checkpoint is dealt with when restoring
            continue
        checkpoint_lib.check_compatible(saved_metadata, metadata, model_dir=model_dir)
        break
    existing.close()
    if latest is None and init_from is not None:
        init_from_lib.resolve(init_from)  # a missing source fails here, before anything is written

    shard, num_shards, host_batch = partitioning.process_data_shard(
        partitioning.batch_sharding(mesh, logical_axis_rules), train_data.batch_size)
    # Epochs are planned (counted up front, equal on every data shard) whenever their
    # boundaries matter: an epoch limit, epoch periods, or several shards that must stop together.
    plan_epochs = bool(num_epochs) or eval_every.in_epochs or checkpoint_every.in_epochs or num_shards > 1
    iterator = input_pipeline.BatchIterator(train_data, num_epochs=num_epochs, host_batch_size=host_batch,
                                            shard_index=shard, num_shards=num_shards, plan_epochs=plan_epochs)
    # The pipelines are built now, so that a bad length or split stops the run before anything
    # is written; the train iterator keeps the one it built for reading.
    with validation.pipeline_errors(train_data):
        steps_per_epoch = iterator.steps_in_epoch(0) if plan_epochs else None
        iterator.prepare()
    if eval_data is not None:
        with validation.pipeline_errors(eval_data):
            input_pipeline.epoch_rows(eval_data, epoch=0, shard_index=shard, num_shards=num_shards)
    total_steps = min(s for s in (train_steps, num_epochs and steps_per_epoch * num_epochs) if s)
    trainer = trainer_lib.Trainer.for_run(model=model, optimizer=optimizer, total_steps=total_steps, mesh=mesh,
                                          rules=logical_axis_rules, loss=loss, microbatches=microbatches)
    example = {k: np.zeros(shape, np.int32) for k, shape in train_data.model_feature_shapes(train_data.batch_size).items()}
    abstract_state = trainer.abstract_state(example)

    checkpoints = checkpoint_lib.Checkpointer(model_dir, retention=retention, async_save=async_checkpoints)
    config_text = gin.operative_config_str()
    writer = metrics.MetricsWriter(checkpoints.work_dir, total_steps=total_steps, initial_step=latest or 0,
                                   enabled=is_chief, progress_bar=progress_bar)
    writer.print(f"model: {model.family}, {model.num_params():,} parameters "
                 f"({model.num_params() - model.num_embedding_params():,} non-embedding); "
                 f"mesh {dict(mesh.shape)} on {jax.device_count()} {jax.devices()[0].platform} device(s)"
                 + (f" in {jax.process_count()} processes" if jax.process_count() > 1 else ""))
    if steps_per_epoch:
        writer.print(f"data: {steps_per_epoch} steps per epoch of {train_data.mixture_or_task_name!r} "
                     f"(epoch 0, counted; later epochs are counted as they start), "
                     f"{num_epochs or 'unlimited'} epoch(s), {num_shards} data shard(s) of {host_batch} rows")

    dropout_rng = trainer.replicated(jax.random.PRNGKey(seed + 1))
    restored = checkpoints.restore_latest_good(
        abstract_state=checkpoint_lib.to_saveable(abstract_state, dropout_rng),
        check=lambda saved: checkpoint_lib.check_compatible(saved, metadata, model_dir=model_dir),
        warn=writer.print)
    if restored is not None:
        latest, saved, iterator_state, _ = restored
        try:
            iterator.set_state(iterator_state)
        except ValueError as e:
            raise RunConfigError(f"{e} Nothing was changed in {model_dir}.") from None
    # Only now, with the saved state accepted (or absent), does this run's config replace the old one.
    if is_chief:
        task = data_lib.get_task(train_data.mixture_or_task_name)
        vocabulary_file = getattr(task.output_features["targets"].vocabulary, "sentencepiece_model_file", None)
        _write_config(checkpoints.work_dir, config_text, vocabulary_file)
    if restored is not None:
        writer.print(f"Resuming from the checkpoint at step {latest} in {checkpoint_lib.checkpoints_dir(model_dir)}.")
        if init_from is not None:
            writer.print(f"train.init_from ({init_from.checkpoint}) is not used: {model_dir} already holds this "
                         f"run's own checkpoint (step {latest}), and a restarted run resumes rather than starting "
                         "over. To start afresh from init_from, use a new MODEL_DIR.")
        dropout_rng = saved.pop("dropout_rng")
        state = trainer_lib.TrainState(**saved)
    else:
        latest = None
        state = trainer.init_state(jax.random.PRNGKey(seed), example)
        if init_from is None:
            writer.print(f"No checkpoint in {model_dir}: initialising from seed {seed}.")
        else:
            writer.print(f"No checkpoint in {model_dir}: starting from train.init_from ({init_from.checkpoint}).")
            state = state.replace(params=init_from_lib.load_params(init_from, target_params=state.params,
                                                                   warn=writer.print))
    step = int(state.step)
    flops_per_token = train_flops_per_token(model, targets_length=train_data.sequence_length,
                                            inputs_length=train_data.inputs_length)
    last_train: dict[str, float] = {}
    last_eval: dict[str, float] = {}
    evaluated_at = None
    window: list[dict[str, jax.Array]] = []
    window_start = time.perf_counter()
    last_saved = latest
    checked = 0  # window entries already checked for non-finite steps

    def check_finite():
        """Stops the run (with on_nonfinite='stop') if a step since the last check was NaN/Inf."""
        nonlocal checked
        if on_nonfinite != "stop" or len(window) == checked:
            return
        flags = jax.device_get([m["nonfinite_steps"] for m in window[checked:]])
        first_bad = next((step - len(window) + checked + i + 1 for i, f in enumerate(flags) if f), None)
        checked = len(window)
        if first_bad is not None:
            kept = f"the last checkpoint (step {last_saved}) is untouched" if last_saved else "no checkpoint was written"
            raise NonFiniteLossError(
                f"The loss or gradients became NaN/Inf at step {first_bad}; the run stopped before saving "
                f"that state ({kept}). Lower the learning rate, enable clipping, check the data, or set "
                "--gin.train.on_nonfinite=\"'skip'\" to skip such steps.")

    def save():
        nonlocal last_saved
        check_finite()
        saved_metrics = {f"eval/{k}": v for k, v in last_eval.items()} if evaluated_at == step else {}
        if last_train:
            saved_metrics["train/loss"] = last_train["loss"]
        blocked = checkpoints.save(step, state=checkpoint_lib.to_saveable(state, dropout_rng),
                                   iterator_state=iterator.get_state(), metadata=metadata,
                                   config_text=config_text, metrics=saved_metrics)
        last_saved = step
        how = "writing in the background" if async_checkpoints else "written"
        writer.print(f"step {step}: checkpoint saved in {checkpoint_lib.checkpoints_dir(model_dir)} "
                     f"(loop blocked {blocked:.2f} s, {how})")

    def report():
        nonlocal window, window_start, last_train, checked
        check_finite()
        last_train = reporting.summarize_window(
            jax.device_get(window), seconds=time.perf_counter() - window_start,
            tokens_per_step=train_data.batch_size * train_data.sequence_length,
            flops_per_token=flops_per_token, peak_flops_per_device=peak_flops_per_device,
            num_devices=jax.device_count())
        writer.scalars("train", step, last_train)
        writer.progress(step, {name: last_train[key] for name, key in reporting.SHOWN_METRICS if key in last_train})
        window, window_start, checked = [], time.perf_counter(), 0

    def run_eval():
        result = validation.validation_loss(trainer, state.params, eval_data, max_batches=eval_batches)
        writer.scalars("eval", step, result)
        writer.print(f"step {step}: validation loss {result['loss']:.4f}, perplexity {result['perplexity']:.2f} "
                     f"({int(result['tokens'])} tokens)")
        for mc in multiple_choice:
            scores = eval_loop.score_multiple_choice_set(mc, model=model, params=state.params,
                                                         encode=lambda text: list(vocabulary.encode(text)))
            writer.scalars(mc.name, step, scores)
            writer.print(f"step {step}: {mc.name} acc {scores['acc']:.4f}, acc_norm {scores['acc_norm']:.4f} "
                         f"({int(scores['examples'])} examples)")
        show_samples()
        nonlocal evaluated_at
        evaluated_at = step
        return result

    def show_samples():
        if not prompts:  # every process decodes (a collective over the mesh); the writer prints on process 0
            return
        texts = sample.sample_texts(model=model, params=state.params, vocabulary=vocabulary, prompts=prompts,
                             max_new_tokens=sample_max_new_tokens, seed=seed + step)
        writer.print(f"step {step} samples:" + "".join(f"\n--- {p!r}\n{p}{t}" for p, t in zip(prompts, texts)))

    vocabulary = data_lib.get_task(train_data.mixture_or_task_name).output_features["targets"].vocabulary
    prompts = [sample_prompt] if isinstance(sample_prompt, str) else list(sample_prompt or ())
    if prompts and model.family != "decoder_only":
        writer.print("samples skipped: sampling during training supports decoder-only models")
        prompts = []
    profiler = profiling.StepProfiler(profile_steps, log_dir=profiling.trace_dir(model_dir, jax.process_index()),
                                      first_step=step, print_fn=writer.print)
    watcher = PreemptionWatcher().__enter__()
    try:
        # Check the step limit before taking a batch: a batch taken is a batch the saved
        # iterator state counts as seen.
        while train_steps is None or step < train_steps:
            batch = next(iterator, None)
            if batch is None:
                break
            global_batch = partitioning.host_batch_to_global(batch, trainer.batch_sharding)
            if step == 0 and init_from is None:
                reporting.sanity_check_initial_loss(trainer, state.params, global_batch, model.vocab_size,
                                           init_loss_tolerance, writer)
            with profiler.step(step, outputs=lambda: state):
                state, step_metrics = trainer.train_step(state, global_batch, dropout_rng)
            step += 1
            window.append(step_metrics)
            if step % log_period == 0 or step == train_steps:
                report()
            if iterator.end_of_epoch:
                writer.print(f"epoch {iterator.epoch} finished at step {step}: "
                             + reporting.describe_epoch_stats(iterator.last_epoch_stats))
            when = dict(step=step, epochs_finished=iterator.epoch, end_of_epoch=iterator.end_of_epoch)
            # The last step's evaluation comes before its checkpoint, which then records it.
            if eval_data is not None and (eval_every.due(**when) or step == train_steps):
                last_eval = run_eval()
            if checkpoint_every.due(**when):
                save()
            stop_reason = watcher.should_stop(step)
            finished = step == train_steps or (num_epochs is not None and iterator.epoch >= num_epochs)
            if stop_reason and not finished:  # a stop asked for at the last step: the run simply ends
                if last_saved != step:
                    save()
                checkpoints.wait()
                raise Preempted(step, stop_reason)
        if window:
            report()
        if eval_data is not None and evaluated_at != step:
            last_eval = run_eval()
        if last_saved != step:
            save()
        checkpoints.wait()
        if eval_data is None:
            show_samples()
    finally:
        profiler.stop()
        watcher.__exit__(None, None, None)
        iterator.close()
        checkpoints.close()
        writer.close()
    return {**{f"train/{k}": v for k, v in last_train.items()},
            **{f"eval/{k}": v for k, v in last_eval.items()}, "step": step}


