"""The train loop: check the run, build it, restore or initialise, then step with hooks beside.

`train` is what gin binds (gin/runs/); it checks the run (run_spec.py), sets it up
(startup.py) and hands the state to `run_steps`, the loop itself. Reports, evaluations,
samples and checkpoints are hooks (builtin_hooks.py), and so are the user's own
(`train.hooks`, hooks.py): the loop calls each after the steps its period names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable, Sequence

import gin
import jax

from t5x_lite import storage
from t5x_lite.checkpoints import checkpoint as checkpoint_lib
from t5x_lite.checkpoints import init_from as init_from_lib
from t5x_lite.checkpoints.retention import RetentionPolicy
from t5x_lite.data import iterators, task_access, task_modules
from t5x_lite.errors import ConfigValueError
from t5x_lite.evaluation import eval_loop
from t5x_lite.metrics import tracking
from t5x_lite.metrics.writer import DEFAULT_WRITERS, MetricsWriter
from t5x_lite.models import BaseModel
from t5x_lite.parallel import distributed, partitioning
from t5x_lite.parallel.placement import Placement, device_memory_bytes
from t5x_lite.training import builtin_hooks, profiling, reporting, run_spec, run_values, startup
from t5x_lite.training import trainer as trainer_lib
from t5x_lite.training.optim import AdamW, Optimizer
from t5x_lite.training.hooks import Hook, Latest, RunContext, StepInfo, check_hooks
from t5x_lite.training.periods import parse_period
from t5x_lite.training.preemption import Preempted, PreemptionWatcher
from t5x_lite.training.run_spec import DEFAULT_MESH_AXES, RunSpec

ON_NONFINITE = ("stop", "skip")


def train(
    *,
    model_dir: str,
    model: BaseModel,
    train_data: task_access.DataConfig,
    eval_data: task_access.DataConfig | None = None,
    optimizer: Optimizer = AdamW(),
    loss: trainer_lib.LossConfig = trainer_lib.LossConfig(),
    mesh_axes: Sequence[tuple[str, int]] | None = DEFAULT_MESH_AXES,
    logical_axis_rules: partitioning.LogicalRules | None = partitioning.DEFAULT_RULES,
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
    metric_writers: Sequence[tracking.MetricWriter] = DEFAULT_WRITERS,
    hooks: Sequence[Hook] = (),
) -> dict[str, float]:
    """Trains a model (decoder-only or encoder-decoder) and returns the last train and eval metrics.

    Args:
      model_dir: where checkpoints, config.gin and TensorBoard logs go; a run resumes from
        the latest checkpoint found here.
      model: the model's family, sizes and switches (a DecoderConfig or T5Config).
      train_data: the task, split, sequence length and batching of training.
      eval_data: the same for the validation loss at each evaluation (None: no evaluation).
      optimizer: @AdamW(), @Adafactor() or another Optimizer, each with its learning-rate schedule
        (docs/optimizers.md).
      loss: z-loss and label smoothing.
      mesh_axes: (axis name, size) pairs; one size may be -1 (all remaining devices). None: data
        parallel when the params and optimizer state fit one device, else FSDP (no mesh file).
      logical_axis_rules: (logical axis, mesh axis / tuple of mesh axes / None) pairs; None:
        partitioning.DEFAULT_RULES.
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
      metric_writers: where the scalars go: [@TensorBoardWriter()] (MODEL_DIR/tb/), @WandbWriter(),
        @MlflowWriter(), several at once (docs/metrics.md); only process 0 writes.
      hooks: the user's own hooks, e.g. [@MyHook()] (subclasses of t5x_lite.training.hooks.Hook
        from a module the gin file imports), called after the built-in ones at each hook's own
        period `every` and after the last step (docs/hooks.md).
    """
    spec = RunSpec(model=model, train_data=train_data, eval_data=eval_data, optimizer=optimizer, loss=loss,
                   mesh_axes=mesh_axes, logical_axis_rules=logical_axis_rules, train_steps=train_steps,
                   num_epochs=num_epochs, microbatches=microbatches, peak_flops_per_device=peak_flops_per_device,
                   model_dir=model_dir)
    # Every value's type and range, once, before anything uses it (all bad ones in one message).
    run_values.check_values(spec, eval_period=eval_period, checkpoint_period=checkpoint_period,
                            eval_batches=eval_batches, log_period=log_period, seed=seed,
                            init_loss_tolerance=init_loss_tolerance, sample_prompt=sample_prompt,
                            sample_max_new_tokens=sample_max_new_tokens, async_checkpoints=async_checkpoints,
                            progress_bar=progress_bar, task_module=task_module, metric_writers=metric_writers)
    # A writer whose package is missing (or an MLflow run without a server) stops here, before anything is written.
    tracking.check_writers(metric_writers, name="train.metric_writers")
    if on_nonfinite not in ON_NONFINITE:
        raise ConfigValueError(f"train.on_nonfinite={on_nonfinite!r}: use one of {ON_NONFINITE}.")
    profiling.check_profile_steps(profile_steps)
    check_hooks(hooks, name="train.hooks")  # each is a Hook, with a period for `every`
    eval_every = parse_period(eval_period, name="train.eval_period")
    checkpoint_every = parse_period(checkpoint_period, name="train.checkpoint_period")
    model_dir = storage.absolute(model_dir)
    spec = dataclasses.replace(spec, model_dir=model_dir)
    run_values.check_model_dir(model_dir)  # a directory we can write (local) or reach (s3://, gs://)
    if task_module:
        task_modules.import_task_module(task_module)
    spec, mesh_note = run_spec.with_default_mesh(spec, device_bytes=device_memory_bytes(jax.local_devices()[0]))
    # The run's one mesh and rule table (resolved for the mesh once): the trainer, the batches,
    # samples and multiple choice all live there.
    placement = Placement(mesh=partitioning.make_mesh(axes=spec.mesh_axes), rules=spec.logical_axis_rules)
    run_spec.check_layout(spec, batch_shards=placement.batch_shards, num_processes=jax.process_count())
    # scan_unroll='auto' becomes the layer layout chosen for this backend, mesh and device, once.
    spec, layers = startup.resolve_layer_layout(spec, placement, platform=jax.devices()[0].platform,
                                                device_bytes=device_memory_bytes(jax.local_devices()[0]))
    model = spec.model
    # The model against the backend, the task's vocabulary, and what evaluations ask of it.
    metadata = run_spec.check_model_and_data(spec, multiple_choice=bool(multiple_choice), sample_prompt=sample_prompt)

    # Decide what to start from before anything is written to the model directory.
    latest = startup.check_model_dir(model_dir, metadata=metadata, init_from=init_from)
    # Epochs are planned (counted up front) whenever their boundaries matter.
    plan_epochs = bool(num_epochs) or eval_every.in_epochs or checkpoint_every.in_epochs
    data = startup.build_train_data(spec, placement.batch_sharding, plan_epochs=plan_epochs)
    total_steps = min(s for s in (train_steps, num_epochs and data.steps_per_epoch * num_epochs) if s)
    # A limit before the latest checkpoint trains nothing: refused before anything is written.
    startup.check_something_to_train(latest, train_steps=train_steps, num_epochs=num_epochs,
                                      steps_per_epoch=data.steps_per_epoch if data.by_index else None,
                                      model_dir=model_dir)
    trainer = trainer_lib.Trainer.for_run(model=model, optimizer=optimizer, total_steps=total_steps,
                                          placement=placement, loss=loss, microbatches=microbatches)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(data.iterator.close)
        # One writer per model directory: taken before the checkpointer cleans up or writes anything.
        lease = cleanup.enter_context(startup.model_dir_lease(model_dir, is_chief=distributed.is_chief(),
                                                              num_processes=jax.process_count()))
        checkpointer = checkpoint_lib.Checkpointer(model_dir, retention=retention, async_save=async_checkpoints)
        cleanup.callback(checkpointer.close)
        config_text = gin.operative_config_str()
        # Closed with the run's status: FINISHED, FAILED, or KILLED (preempted, a signal, Ctrl-C).
        writer = cleanup.enter_context(MetricsWriter(
            checkpointer.work_dir, total_steps=total_steps, initial_step=latest or 0, enabled=distributed.is_chief(),
            progress_bar=progress_bar, writers=metric_writers, model_dir=model_dir, config_text=config_text,
            stopped_by=(Preempted,)))
        startup.describe_run(writer, spec, placement.mesh, data, mesh_note=mesh_note, layers=layers)
        start = startup.restore_or_initialise(spec=spec, trainer=trainer, checkpointer=checkpointer,
                                              iterator=data.iterator, metadata=metadata, config_text=config_text,
                                              init_from=init_from, seed=seed, writer=writer,
                                              is_chief=distributed.is_chief())
        # config.gin describes the checkpoints beside it: the old one goes back if this run saves none.
        latest_saved = Latest(saved_step=start.restored_step)
        cleanup.callback(lambda: startup.put_back_config(checkpointer.work_dir, start,
                                                         saved_step=latest_saved.saved_step))
        # The loop's hooks: the built-in ones in their order (builtin_hooks.py), then the user's.
        built_in, checkpoints = builtin_hooks.builtin_hooks(
            spec=spec, writer=writer, trainer=trainer, placement=placement, iterator=data.iterator,
            checkpointer=checkpointer, lease=lease, dropout_rng=start.dropout_rng, metadata=metadata,
            config_text=config_text, stop_on_nonfinite=on_nonfinite == "stop", log_period=log_period,
            eval_period=eval_period, eval_batches=eval_batches, multiple_choice=multiple_choice,
            sample_prompt=sample_prompt, sample_max_new_tokens=sample_max_new_tokens, seed=seed,
            checkpoint_every=checkpoint_every, async_checkpoints=async_checkpoints)
        profiler = profiling.StepProfiler(profile_steps, log_dir=profiling.trace_dir(model_dir, jax.process_index()),
                                          first_step=int(start.state.step), print_fn=writer.print)
        cleanup.callback(profiler.stop)
        initial_loss_check = None  # a new run scores its first batch before the first step: near ln(vocab)?
        if start.restored_step is None and init_from is None:
            initial_loss_check = functools.partial(reporting.sanity_check_initial_loss, trainer,
                                                   vocab_size=model.vocab_size, tolerance=init_loss_tolerance,
                                                   writer=writer)
        run = RunContext(model_dir=model_dir, model=model, trainer=trainer, print=writer.print, scalars=writer.scalars,
                         is_chief=distributed.is_chief(), start_step=int(start.state.step))
        info = run_steps(
            state=start.state, dropout_rng=start.dropout_rng, trainer=trainer, iterator=data.iterator,
            train_steps=train_steps, num_epochs=num_epochs, hooks=[*built_in, *hooks], run=run,
            latest=latest_saved, save_on_stop=checkpoints.save_and_wait,
            profiler=profiler, watcher=cleanup.enter_context(PreemptionWatcher()),
            initial_loss_check=initial_loss_check)
    return {**{f"train/{k}": v for k, v in info.latest.train.items()},
            **{f"eval/{k}": v for k, v in info.latest.eval.items()}, "step": info.step}


def run_steps(*, state: trainer_lib.TrainState, dropout_rng: jax.Array, trainer: trainer_lib.Trainer,
              iterator: iterators.DataIterator, train_steps: int | None, num_epochs: int | None,
              hooks: Sequence[Hook], run: RunContext, latest: Latest,
              save_on_stop: Callable[[StepInfo], None], profiler: profiling.StepProfiler, watcher: PreemptionWatcher,
              initial_loss_check: Callable | None = None) -> StepInfo:
    """The loop: a step, then each hook that is due (`start` before, `at_end` after); stops at the
    step or epoch limit, or saves and stops when asked to (SIGTERM, a preemption notice)."""
    periods = check_hooks(hooks, name="train.hooks")
    step = int(state.step)
    info = StepInfo(step=step, state=state, metrics={}, epochs_finished=iterator.epoch, end_of_epoch=False,
                    final=False, latest=latest)
    for hook in hooks:
        hook.start(run)
    # Check the step limit before taking a batch: a batch taken is a batch the saved
    # iterator state counts as seen.
    while train_steps is None or step < train_steps:
        batch = next(iterator, None)
        if batch is None:
            break
        batch = trainer.place_batch(batch)
        if step == 0 and initial_loss_check:
            initial_loss_check(state.params, batch)
        with profiler.step(step, outputs=lambda: state):
            state, metrics = trainer.train_step(state, batch, dropout_rng)
        step += 1
        info = StepInfo(step=step, state=state, metrics=metrics, epochs_finished=iterator.epoch,
                        end_of_epoch=iterator.end_of_epoch, latest=latest,
                        final=step == train_steps or (num_epochs is not None and iterator.epoch >= num_epochs))
        for hook, period in zip(hooks, periods):
            if info.final or info.due(period):
                hook.run(info)
        stop_reason = watcher.should_stop(step)
        if stop_reason and not info.final:  # a stop asked for at the last step: the run simply ends
            save_on_stop(info)
            raise Preempted(step, stop_reason)
    for hook in hooks:
        hook.at_end(info)
    return info
