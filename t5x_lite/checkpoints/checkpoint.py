"""Orbax checkpoints of the full train state, the data iterator, the config and the run's metadata.

Layout of a model directory:

    MODEL_DIR/config.gin              the resolved gin config of the latest run
    MODEL_DIR/vocab/spm.model         the vocabulary, so the directory is self-contained
    MODEL_DIR/checkpoints/<step>/     state: params, opt_state (float32 whatever the compute
                                      dtype), step and the dropout RNG key;
                                      data_iterator: its position (JSON);
                                      metadata: model, task, mesh, metrics (JSON);
                                      config: the resolved gin config of the run (JSON)
    MODEL_DIR/checkpoints_damaged/    checkpoints that failed to restore, moved aside

Saves are asynchronous: `save` returns once the arrays are copied to host memory and Orbax
writes them in a background thread; the next save waits for it, so at most one is in flight.
Orbax writes each step to a temporary directory and renames it when complete, so a checkpoint
that is listed is a whole one (on `s3://`, see s3_mirror.py: a COMMITTED marker written last).
"""

from __future__ import annotations

import os
import posixpath
import time
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

from t5x_lite import storage
from t5x_lite.checkpoints.retention import RetentionPolicy, steps_to_keep

# One name for the checkpoints' folder, shared with the s3 mirror's layout.
from t5x_lite.checkpoints.s3_mirror import CHECKPOINTS as CHECKPOINTS_SUBDIR
from t5x_lite.checkpoints.s3_mirror import S3Mirror
from t5x_lite.errors import UserError
from t5x_lite.parallel import distributed

DAMAGED_SUBDIR = "checkpoints_damaged"


class CheckpointMismatchError(UserError, ValueError):
    """The model directory holds checkpoints of a different model."""


class NoUsableCheckpointError(UserError, ValueError):
    """Checkpoints exist but none of them can be restored; nothing was changed."""


class CheckpointNotFoundError(UserError, ValueError):
    """The path or step named holds no checkpoint."""


def checkpoints_dir(model_dir: str) -> str:
    return storage.join(storage.absolute(model_dir), CHECKPOINTS_SUBDIR)


def locate(path: str, step: int | None = None) -> tuple[str, int]:
    """(model directory, step) of a model directory (its latest step unless `step`) or of a step
    directory MODEL_DIR/checkpoints/<step>; raises CheckpointNotFoundError naming what exists."""
    path = storage.absolute(os.fspath(path)).rstrip("/")
    split = posixpath.split if storage.is_url(path) else os.path.split
    parent, name = split(path)
    if name.isdigit() and split(parent)[1] == CHECKPOINTS_SUBDIR:
        if step is not None and step != int(name):
            raise CheckpointNotFoundError(f"{path} is the checkpoint of step {name}, not of step {step}.")
        return split(parent)[0], int(name)
    checkpointer = Checkpointer(path, create=False)
    steps = checkpointer.all_steps()
    checkpointer.close()
    if not steps:
        raise CheckpointNotFoundError(f"no checkpoint in {path}; name a model directory with checkpoints/ "
                                      "(a trained run's MODEL_DIR) or a step directory MODEL_DIR/checkpoints/<step>.")
    if step is None:
        return path, steps[-1]
    if step not in steps:
        raise CheckpointNotFoundError(f"no checkpoint at step {step} in {path}; available: {steps}.")
    return path, step


class Checkpointer:
    """Saves and restores steps of a run in `model_dir` (local, `gs://` or `s3://`).

    Args:
      model_dir: the run's directory.
      retention: which checkpoints survive a new save (see retention.py).
      create: create the directory (False: only read what is there).
      async_save: write in a background thread (False: `save` returns when the step is on disk).
    """

    def __init__(self, model_dir: str, *, retention: RetentionPolicy = RetentionPolicy(), create: bool = True,
                 async_save: bool = True):
        self.model_dir = storage.absolute(os.fspath(model_dir))
        self._mirror = S3Mirror(self.model_dir) if storage.is_s3(self.model_dir) else None
        # Where files are written: the model directory itself, or the staging copy of an s3 one.
        self.work_dir = self._mirror.local_dir if self._mirror else self.model_dir
        self._retention = retention
        self._metrics: dict[int, dict[str, float]] = {}
        self._remote_steps: list[int] | None = None
        if self._mirror:
            self._remote_steps = self._mirror.committed_steps()
            self._mirror.drop_uncommitted_local_steps(self._remote_steps)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None, create=create, enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True)
        # Handlers named up front, so that metadata (shapes, dtypes) can be read before any restore.
        handlers = {"state": ocp.StandardCheckpointHandler(), "data_iterator": ocp.JsonCheckpointHandler(),
                    "metadata": ocp.JsonCheckpointHandler(), "config": ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(storage.join(self.work_dir, CHECKPOINTS_SUBDIR), options=options,
                                              item_handlers=handlers)

    # -- listing ---------------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        """Complete checkpoints, ascending."""
        if self._mirror:
            return list(self._remote_steps)
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    # -- saving ----------------------------------------------------------------------------------

    def save(self, step: int, *, state: Any, iterator_state: dict, metadata: dict, config_text: str = "",
             metrics: dict[str, float] | None = None) -> float:
        """Starts saving `step`; returns the seconds the caller was blocked.

        Raises the error of the previous save if it failed (a full disk, an unreachable bucket):
        a failed save never replaces an earlier checkpoint.
        """
        start = time.perf_counter()
        if self._mirror:
            self._mirror.wait()
            self._drop_staged_steps_before(step)
        metrics = {k: float(v) for k, v in (metrics or {}).items()}
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data_iterator=ocp.args.JsonSave(iterator_state),
            metadata=ocp.args.JsonSave({**metadata, "step": step, "metrics": metrics}),
            config=ocp.args.JsonSave({"gin": config_text}),
        ))
        self._metrics[step] = metrics
        if self._mirror:
            self._mirror.upload_in_background(step, wait_for_local=self._manager.wait_until_finished,
                                              after=lambda: self._committed_on_s3(step))
        else:
            self._apply_retention(in_flight=step)
        return time.perf_counter() - start

    def _saved_metrics(self, step: int) -> dict[str, float]:
        """The metrics saved with `step` (read once; on s3 from its metadata object, not the step)."""
        if step not in self._metrics:
            try:
                metadata = self._mirror.saved_metadata(step) if self._mirror else self.metadata(step)
                self._metrics[step] = metadata.get("metrics", {})
            except Exception:  # noqa: BLE001 - an unreadable step has no metrics to rank
                self._metrics[step] = {}
        return self._metrics[step]

    def _dropped_by_retention(self, steps: set[int]) -> list[int]:
        """The finished `steps` the policy does not keep (metrics are read only to rank the best)."""
        metrics = {s: self._saved_metrics(s) for s in steps} if self._retention.keep_best else {}
        return sorted(steps - steps_to_keep(steps, metrics, self._retention))

    def _apply_retention(self, *, in_flight: int | None = None) -> None:
        """Deletes what the policy drops among finished steps; the one in flight does not count yet,
        so a save that fails never leaves the directory with fewer good checkpoints."""
        for step in self._dropped_by_retention(set(self._manager.all_steps()) - {in_flight}):
            self._manager.delete(step)

    def _committed_on_s3(self, step: int) -> None:
        """Runs in the upload thread once `step` is committed: retention over the steps on s3."""
        steps = set(self._remote_steps) | {step}
        dropped = [s for s in self._dropped_by_retention(steps) if s != step]
        for old in dropped:
            self._mirror.delete_step(old)
        self._remote_steps = sorted(steps - set(dropped))

    def _drop_staged_steps_before(self, step: int) -> None:
        """Empties the s3 staging directory of uploaded steps before writing a new one."""
        for old in self._manager.all_steps():
            if old < step:
                self._manager.delete(old)

    def wait(self) -> None:
        """Blocks until the save in flight is complete (on s3: uploaded); raises its error."""
        self._manager.wait_until_finished()
        self._manager.check_for_errors()
        if self._mirror:
            self._mirror.wait()
        elif self._manager.all_steps():
            self._apply_retention()

    # -- restoring -------------------------------------------------------------------------------

    def _ready(self, step: int) -> None:
        """Makes `step` readable by Orbax (on s3: downloads it into the staging directory)."""
        if self._mirror and not os.path.isdir(self._mirror.local_step_dir(step)):
            self._mirror.fetch(step)
            self._manager.reload()

    def restore(self, step: int, *, abstract_state: Any) -> tuple[Any, dict, dict]:
        """Restores into `abstract_state`'s shapes, dtypes and shardings (any mesh: Orbax reshards)."""
        self._ready(step)
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data_iterator=ocp.args.JsonRestore(),
            metadata=ocp.args.JsonRestore(),
        ))
        return restored["state"], restored["data_iterator"], restored["metadata"]

    def restore_params(self, step: int, *, only: Callable[[str], bool] | None = None,
                       shapes: Any = None) -> Any:
        """The parameters of a step, on this process's first device, whatever mesh saved them.

        `only('decoder/layers/attention/query/kernel')` picks which arrays are read (a converter
        reads a checkpoint one array at a time this way); the others are left out of the tree.
        `shapes`: the step's `state_shapes()["params"]`, when the caller already has them (reading
        them takes longer than restoring a small array).
        """
        self._ready(step)
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                              self.state_shapes(step)["params"] if shapes is None else shapes)
        if only is not None:
            target = _select(target, only)
        # A partial restore (the optimizer state is not read) needs the PyTree handler itself.
        with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as reader:
            restored = reader.restore(
                self._manager.directory / str(step) / "state",
                args=ocp.args.PyTreeRestore(item={"params": target}, partial_restore=True, restore_args=jax.tree.map(
                    lambda _: ocp.ArrayRestoreArgs(sharding=device), {"params": target})))
        return restored["params"]

    def metadata(self, step: int) -> dict:
        self._ready(step)
        return self._manager.restore(step, args=ocp.args.Composite(metadata=ocp.args.JsonRestore()))["metadata"]

    def config_text(self, step: int) -> str:
        """The resolved gin config saved with `step` ('' for checkpoints saved without one)."""
        self._ready(step)
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
        except (FileNotFoundError, KeyError, ValueError):
            return ""
        return restored["config"].get("gin", "")

    def iterator_state(self, step: int) -> dict:
        self._ready(step)
        return self._manager.restore(step, args=ocp.args.Composite(
            data_iterator=ocp.args.JsonRestore()))["data_iterator"]

    def state_shapes(self, step: int) -> Any:
        """The saved state's tree of array metadata (shape, dtype), read without the arrays."""
        self._ready(step)
        return self._manager.item_metadata(step)["state"]

    def restore_latest_good(self, *, abstract_state: Any, check: Callable[[dict], None],
                            warn: Callable[[str], None]) -> tuple[int, Any, dict, dict] | None:
        """Restores the newest checkpoint that restores; damaged newer ones are moved aside.

        `check(metadata)` raises CheckpointMismatchError for a checkpoint of another model (that
        is not damage: it stops the run). Returns None when there is no checkpoint, and raises
        NoUsableCheckpointError (moving nothing) when there are some but none restores.
        """
        damaged: list[tuple[int, str]] = []
        for step in reversed(self.all_steps()):
            try:
                metadata = self.metadata(step)
            except Exception as e:  # noqa: BLE001 - any failure to read means damage
                damaged.append((step, _one_line(e)))
                continue
            check(metadata)
            check_same_structure(self.state_shapes(step), abstract_state, step=step, model_dir=self.model_dir)
            try:
                state, iterator_state, metadata = self.restore(step, abstract_state=abstract_state)
            except Exception as e:  # noqa: BLE001
                damaged.append((step, _one_line(e)))
                continue
            for bad, reason in damaged:
                where = self.move_aside(bad)
                warn(f"WARNING: the checkpoint at step {bad} is damaged ({reason}); moved it to {where} "
                     f"and restored step {step} instead.")
            return step, state, iterator_state, metadata
        if damaged:
            raise NoUsableCheckpointError(
                f"None of the checkpoints in {checkpoints_dir(self.model_dir)} can be restored:\n  "
                + "\n  ".join(f"step {s}: {r}" for s, r in damaged)
                + "\nNothing was changed. Move the directory away to start afresh, or copy a good "
                "checkpoint back into it.")
        return None

    def move_aside(self, step: int) -> str:
        """Moves a damaged step to MODEL_DIR/checkpoints_damaged/<step>-<time>; returns where."""
        destination = storage.join(self.model_dir, DAMAGED_SUBDIR, f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
        if self._mirror:
            self._remote_steps = [s for s in self._remote_steps if s != step]
            if os.path.isdir(self._mirror.local_step_dir(step)):
                self._manager.delete(step)
        if distributed.is_chief():
            storage.rename(storage.join(checkpoints_dir(self.model_dir), str(step)), destination)
            if self._mirror:
                self._mirror.forget(step)
        self._manager.reload()
        return destination

    def close(self) -> None:
        """Waits for the save in flight, then releases Orbax's threads."""
        try:
            self.wait()
        finally:
            self._manager.close()


def _select(tree: dict, keep: Callable[[str], bool], prefix: str = "") -> dict:
    """The leaves of a nested dict whose '/'-joined path `keep` accepts (empty branches dropped)."""
    out = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            branch = _select(value, keep, f"{path}/")
            if branch:
                out[key] = branch
        elif keep(path):
            out[key] = value
    return out


def _one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return first[:300]


def _key_name(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _shapes_by_path(tree: Any) -> dict[str, tuple[int, ...]]:
    """{'opt_state/1/0/mu/decoder/...': shape} whether containers are namedtuples, lists or dicts."""
    return {"/".join(_key_name(k) for k in path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree) if hasattr(leaf, "shape")}


def structure_differences(saved_shapes: Any, wanted: Any, *, limit: int = 8) -> list[str]:
    """One line per array whose presence or shape differs between two trees of shapes
    (at most `limit` of each kind), named by its '/'-joined path."""
    saved, want = _shapes_by_path(saved_shapes), _shapes_by_path(wanted)
    missing = sorted(set(want) - set(saved))
    extra = sorted(set(saved) - set(want))
    shapes = sorted(k for k in set(saved) & set(want) if saved[k] != want[k])
    return ([f"missing from the checkpoint: {k}" for k in missing[:limit]]
            + [f"in the checkpoint only: {k}" for k in extra[:limit]]
            + [f"{k}: checkpoint {saved[k]} vs config {want[k]}" for k in shapes[:limit]])


def check_same_structure(saved_shapes: Any, abstract_state: Any, *, step: int, model_dir: str) -> None:
    """Raises CheckpointMismatchError naming the arrays whose presence or shape differ.

    Tells a changed configuration (another optimizer, other sizes) apart from a damaged file.
    """
    lines = structure_differences(saved_shapes, abstract_state)
    if not lines:
        return
    raise CheckpointMismatchError(
        f"The checkpoint at step {step} in {checkpoints_dir(model_dir)} does not fit this run's train state "
        f"(model or optimizer changed?):\n  " + "\n  ".join(lines)
        + "\nResume with the config the directory was trained with (its config.gin), or start a new "
        "--gin.MODEL_DIR with --gin.train.init_from to take only the parameters. Nothing was changed.")


def check_compatible(saved: dict, current: dict, *, model_dir: str) -> None:
    """Raises CheckpointMismatchError naming each model field that differs."""
    saved_model, current_model = saved.get("model", {}), current.get("model", {})
    # Fields that change the parameter tree; switches like remat do not.
    keys = sorted(set(saved_model) | set(current_model))
    shape_fields = [k for k in keys if k not in ("dtype", "remat_policy", "dropout_rate", "scan_layers")]
    diffs = [f"{k}: checkpoint {saved_model.get(k)!r} vs config {current_model.get(k)!r}"
             for k in shape_fields if saved_model.get(k) != current_model.get(k)]
    if saved.get("family") != current.get("family"):
        diffs.insert(0, f"family: checkpoint {saved.get('family')!r} vs config {current.get('family')!r}")
    if saved_model.get("scan_layers") != current_model.get("scan_layers"):
        diffs.append(f"scan_layers: checkpoint {saved_model.get('scan_layers')!r} vs config "
                     f"{current_model.get('scan_layers')!r} (parameter layouts differ)")
    if diffs:
        raise CheckpointMismatchError(
            f"{checkpoints_dir(model_dir)} holds checkpoints of a different model:\n  "
            + "\n  ".join(diffs)
            + "\nUse a new --gin.MODEL_DIR for this model, or restore the config the directory "
            "was trained with (see its config.gin). Nothing was changed in the directory."
        )


def to_saveable(state: Any, dropout_rng: jax.Array) -> dict:
    """The train state as a plain dict tree (what Orbax writes), with the dropout RNG key."""
    return {"step": state.step, "params": state.params, "opt_state": state.opt_state, "dropout_rng": dropout_rng}
