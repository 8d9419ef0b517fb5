"""Everything `train` does before its first step: choose the layer layout (`scan_unroll='auto'`),
check the model directory, build the data iterator, and restore the latest good checkpoint or
initialise (from a seed or `init_from`).

The order is what keeps a model directory safe: every check that can fail runs before
anything is written to it (a run whose limit lies before the latest checkpoint is refused: it
could train nothing), and this run's config replaces the saved one only once the saved state has
been accepted (or found absent). MODEL_DIR/config.gin describes the checkpoints beside it: a
resumed run that writes none (stopped on a NaN, or already at its limit) puts the old one back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

from t5x_lite import storage
from t5x_lite.checkpoints import checkpoint as checkpoint_lib
from t5x_lite.checkpoints import init_from as init_from_lib
from t5x_lite.checkpoints import lease as lease_lib
from t5x_lite.data import iterators, task_access
from t5x_lite.data.vocab import hf_vocabulary
from t5x_lite.errors import RunConfigError
from t5x_lite.metrics.writer import MetricsWriter
from t5x_lite.models.base import AUTO_UNROLL
from t5x_lite.parallel import layer_layout, partitioning
from t5x_lite.training.run_spec import RunSpec, train_state_bytes
from t5x_lite.training.trainer import Trainer, TrainState


def check_model_dir(model_dir: str, *, metadata: dict, init_from: init_from_lib.InitFrom | None) -> int | None:
    """The latest step saved in `model_dir` (None: none), after checking that the newest readable
    checkpoint belongs to this run and that an `init_from` source exists. Writes nothing."""
    existing = checkpoint_lib.Checkpointer(model_dir, read_only=True)
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
    return latest


def check_something_to_train(latest: int | None, *, train_steps: int | None, num_epochs: int | None,
                             steps_per_epoch: int | None, model_dir: str) -> None:
    """Refuses a run whose step or epoch limit lies before a readable checkpoint in `model_dir`
    (`latest`: its latest step): it could train nothing. `steps_per_epoch`: exact (data read by
    index), else None. A run already at its limit is not refused: it is done (evaluates, writes no
    checkpoint); nor is one past whose limit lie only damaged or incomplete steps (moved aside)."""
    limits = [(train_steps, f"TRAIN_STEPS is {train_steps}")]
    if num_epochs and steps_per_epoch:
        end = num_epochs * steps_per_epoch
        limits.append((end, f"NUM_EPOCHS={num_epochs} ends at step {end} ({steps_per_epoch} steps per epoch)"))
    limit, words = min(((s, w) for s, w in limits if s is not None), default=(None, ""))
    if latest is None or limit is None or latest <= limit:
        return
    existing = checkpoint_lib.Checkpointer(model_dir, read_only=True)
    try:
        past = [step for step in existing.all_steps() if step > limit and existing.check(step).readable]
    finally:
        existing.close()
    if past:
        raise RunConfigError(f"Nothing to train: the latest checkpoint in {model_dir} is step {max(past)} and "
                             f"{words}; raise TRAIN_STEPS (or NUM_EPOCHS) to train further. Nothing was changed.")


@contextlib.contextmanager
def model_dir_lease(model_dir: str, *, is_chief: bool, num_processes: int = 1) -> Iterator[lease_lib.Lease | None]:
    """This run's lease on `model_dir` (the chief's; None on other processes), renewed in the
    background and released on the way out: a second trainer on the directory stops at once.

    Taken after every check has passed, so a refused run leaves the directory as it was (a
    model directory created here only to hold the lease is removed again if still empty). With
    several processes the chief tells the others whether it got the lease, so that all stop.
    """
    created = is_chief and not storage.is_url(model_dir) and not os.path.exists(model_dir)
    lease, refusal = None, None
    if is_chief:
        try:
            lease = lease_lib.Lease.acquire(model_dir)
        except lease_lib.LeaseHeldError as e:
            refusal = e
    if num_processes > 1 and not multihost_utils.broadcast_one_to_all(np.int32(refusal is None)):
        refusal = refusal or lease_lib.LeaseHeldError(
            f"{model_dir} is in use by another run: the chief process (process 0) could not take its lease; "
            "its log names the holder.")
    try:
        if refusal is not None:
            raise refusal
        if lease is not None:
            lease.start_renewing()
        yield lease
    finally:
        if lease is not None:
            lease.release()
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(model_dir)  # only if nothing else was written


@dataclasses.dataclass(frozen=True)
class TrainData:
    """The train iterator of this process and how the batch is split over processes."""

    iterator: iterators.DataIterator
    steps_per_epoch: int | None  # None when epochs are not planned
    num_shards: int
    host_batch: int
    streamed_because: str  # why the data is read by streaming; '' when it is read by index

    @property
    def by_index(self) -> bool:
        return not self.streamed_because


def build_train_data(spec: RunSpec, batch_sharding: Any, *, plan_epochs: bool) -> TrainData:
    """The train iterator (by index when the task allows, else streaming), with the train and eval
    pipelines built now: a bad length or split stops the run before anything is written."""
    shard, num_shards, host_batch = partitioning.process_data_shard(batch_sharding, spec.train_data.batch_size)
    batches = iterators.build(spec.train_data, num_epochs=spec.num_epochs, host_batch_size=host_batch,
                              shard_index=shard, num_shards=num_shards, plan_epochs=plan_epochs)
    if spec.eval_data is not None:
        iterators.check_split(spec.eval_data, shard_index=shard, num_shards=num_shards)
    return TrainData(iterator=batches.iterator, steps_per_epoch=batches.steps_per_epoch, num_shards=num_shards,
                     host_batch=host_batch, streamed_because=batches.streamed_because)


def resolve_layer_layout(spec: RunSpec, placement: Any, *, platform: str,
                         device_bytes: int | None) -> tuple[RunSpec, str]:
    """`spec` with `scan_unroll='auto'` replaced by the number parallel/layer_layout.py chooses for
    this backend, the placement's mesh and a device of `device_bytes` (None: unknown), and the
    layout in words for the start-up line. Anything downstream (the step, the checkpoint metadata,
    samples) sees that number; a config that gives one is kept as it is."""
    model = spec.model
    if not model.scan_layers or model.scan_unroll != AUTO_UNROLL:  # 'auto' with unrolled layers: 1, unused
        words = ("unrolled (scan_layers=False)" if not model.scan_layers else
                 ("scanned" if model.scan_unroll == 1 else f"scan_unroll={model.scan_unroll}") + " (as configured)")
        kept = dataclasses.replace(model, scan_unroll=model.layers_per_iteration)
        return dataclasses.replace(spec, model=kept), words
    data = spec.train_data

    def unrolled_bytes() -> float:
        params, state = train_state_bytes(spec)
        return layer_layout.unrolled_step_bytes(
            model, rows=data.batch_size // placement.batch_shards // spec.microbatches, length=data.sequence_length,
            inputs_length=data.inputs_length, state_bytes=state,
            gradient_bytes=params * (1 if spec.microbatches == 1 else 2), platform=platform)

    try:
        layers = layer_layout.num_layers(model)
    except NotImplementedError:  # a family without the activation arithmetic
        layers = None
    chosen = layer_layout.choose(platform=platform, mesh_shape=dict(placement.mesh.shape), num_layers=layers,
                                 device_bytes=device_bytes, unrolled_bytes=unrolled_bytes)
    resolved = dataclasses.replace(model, scan_unroll=chosen.scan_unroll)
    return dataclasses.replace(spec, model=resolved), chosen.describe()


def describe_run(writer: MetricsWriter, spec: RunSpec, mesh: Any, data: TrainData, *,
                 mesh_note: str | None = None, layers: str | None = None) -> None:
    """The start-up lines: the model and mesh (and why, when it was chosen), the layer layout, and how
    the data is read."""
    model = spec.model
    writer.print(f"model: {model.family}, {model.num_params():,} parameters "
                 f"({model.num_params() - model.num_embedding_params():,} non-embedding), "
                 f"{model.attention()} attention; "
                 f"mesh {dict(mesh.shape)} on {jax.device_count()} {jax.devices()[0].platform} device(s)"
                 + (f" in {jax.process_count()} processes" if jax.process_count() > 1 else "")
                 + (f": {mesh_note}" if mesh_note else ""))
    if layers:
        writer.print(f"layers: {layers}")
    epochs = f"{spec.num_epochs or 'unlimited'} epoch(s)"
    if data.by_index:
        writer.print(f"data: {data.iterator.describe()}; {epochs}")
    elif data.steps_per_epoch:
        writer.print(f"data: {data.steps_per_epoch} steps per epoch of {spec.train_data.mixture_or_task_name!r} "
                     f"(epoch 0, counted; later epochs are counted as they start), {epochs}, {data.num_shards} "
                     f"data shard(s) of {data.host_batch} rows; read by streaming: {data.streamed_because}")
    else:
        writer.print(f"data: {spec.train_data.mixture_or_task_name!r} read by streaming: {data.streamed_because}")


def write_run_files(work_dir: str, *, config_text: str, train_data: task_access.DataConfig) -> None:
    """config.gin and vocab/ of the run, and hf/ for a Hugging Face tokenizer (in an s3 run's staging
    directory: uploaded with checkpoints)."""
    vocabulary = task_access.targets_vocabulary(train_data)
    vocabulary_file = getattr(vocabulary, "sentencepiece_model_file", None)
    storage.makedirs(work_dir)
    storage.write_whole(storage.join(work_dir, "config.gin"), config_text)
    if vocabulary_file:
        storage.makedirs(storage.join(work_dir, "vocab"))
        storage.copy(vocabulary_file, storage.join(work_dir, "vocab", "spm.model"))
    hf_vocabulary.write_model_dir_files(vocabulary, work_dir)  # what sample, eval, infer and to-hf read


@dataclasses.dataclass(frozen=True)
class StartingPoint:
    """The state the first step starts from, and the step it was saved at (None: a new run)."""

    state: TrainState
    dropout_rng: jax.Array
    restored_step: int | None
    replaced_config: str | None = None  # the config.gin this run replaced on resuming (None: none)


def restore_or_initialise(*, spec: RunSpec, trainer: Trainer, checkpointer: checkpoint_lib.Checkpointer,
                          iterator: iterators.DataIterator, metadata: dict, config_text: str,
                          init_from: init_from_lib.InitFrom | None, seed: int, writer: MetricsWriter,
                          is_chief: bool) -> StartingPoint:
    """The latest good checkpoint of the run (its state and data position), or a new state."""
    model_dir = checkpointer.model_dir
    example = {k: np.zeros(shape, np.int32)
               for k, shape in spec.train_data.model_feature_shapes(spec.train_data.batch_size).items()}
    dropout_rng = trainer.replicated(jax.random.PRNGKey(seed + 1))
    restored = checkpointer.restore_latest_good(
        abstract_state=checkpoint_lib.to_saveable(trainer.abstract_state(example), dropout_rng),
        check=lambda saved: checkpoint_lib.check_compatible(saved, metadata, model_dir=model_dir),
        warn=writer.print)
    if restored is not None:
        latest, saved, iterator_state, _ = restored
        try:
            iterator.set_state(iterator_state)
        except ValueError as e:
            raise RunConfigError(f"{e} Nothing was changed in {model_dir}.") from None
    if restored is None:
        state = _initial_state(trainer, example, model_dir=model_dir, seed=seed, init_from=init_from, writer=writer)
        # Only now, with the starting state built (init_from's parameters mapped), is anything written.
        if is_chief:
            if init_from is not None:  # its tokenizer and config.json (hf/ of a from-hf conversion)
                init_from_lib.copy_hf_files(init_from, checkpointer.work_dir, log=writer.print)
            write_run_files(checkpointer.work_dir, config_text=config_text, train_data=spec.train_data)
        return StartingPoint(state=state, dropout_rng=dropout_rng, restored_step=None)
    # Only now, with the saved state accepted, does this run's config replace the old one.
    replaced_config = None
    if is_chief:
        replaced_config = _read_config(checkpointer.work_dir)
        write_run_files(checkpointer.work_dir, config_text=config_text, train_data=spec.train_data)
    writer.print(f"Resuming from the checkpoint at step {latest} in {checkpoint_lib.checkpoints_dir(model_dir)}.")
    if spec.train_steps is not None and latest >= spec.train_steps:
        writer.print(f"Nothing to train: step {latest} is TRAIN_STEPS already; raise TRAIN_STEPS or use a new "
                     "MODEL_DIR to train.")
    if init_from is not None:
        writer.print(f"train.init_from ({init_from.checkpoint}) is not used: {model_dir} already holds this "
                     f"run's own checkpoint (step {latest}), and a restarted run resumes rather than starting "
                     "over. To start afresh from init_from, use a new MODEL_DIR.")
    dropout_rng = saved.pop("dropout_rng")
    return StartingPoint(state=TrainState(**saved), dropout_rng=dropout_rng, restored_step=latest,
                         replaced_config=replaced_config)


def put_back_config(work_dir: str, start: StartingPoint, *, saved_step: int | None) -> None:
    """Puts back the config.gin this run replaced when it resumed, if it saved no checkpoint since
    (`saved_step` is still the step it resumed from): the checkpoints beside config.gin were all
    trained with the old settings."""
    if start.replaced_config is not None and saved_step == start.restored_step:
        storage.write_whole(storage.join(work_dir, "config.gin"), start.replaced_config)


def _read_config(work_dir: str) -> str | None:
    """MODEL_DIR/config.gin's text, byte for byte (None: there is none)."""
    path = storage.join(work_dir, "config.gin")
    if not storage.exists(path):
        return None
    with storage.open(path, "rb") as f:
        return f.read().decode("utf-8")


def _initial_state(trainer: Trainer, example: dict, *, model_dir: str, seed: int,
                   init_from: init_from_lib.InitFrom | None, writer: MetricsWriter) -> TrainState:
    state = trainer.init_state(jax.random.PRNGKey(seed), example)
    if init_from is None:
        writer.print(f"No checkpoint in {model_dir}: initialising from seed {seed}.")
        return state
    writer.print(f"No checkpoint in {model_dir}: starting from train.init_from ({init_from.checkpoint}).")
    return state.replace(params=init_from_lib.load_params(init_from, target_params=state.params, warn=writer.print))
