"""Orbax checkpoints of the full train state, the data iterator, the config and the run's metadata.

Layout of a model directory:

    MODEL_DIR/config.gin              the resolved gin config of the run that wrote the checkpoints beside it
    MODEL_DIR/lease.json              the running trainer's lease (lease.py): one writer at a time
    MODEL_DIR/vocab/spm.model         the vocabulary, so the directory is self-contained
    MODEL_DIR/checkpoints/<step>/     state: params, opt_state (float32 whatever the compute
                                      dtype), step and the dropout RNG key;
                                      data_iterator: its position (JSON);
                                      metadata: model, task, mesh, metrics (JSON);
                                      config: the resolved gin config of the run (JSON);
                                      manifest.json: size and CRC32C of every file (manifest.py)
    MODEL_DIR/checkpoints_damaged/    checkpoints that failed to restore, moved aside by `train`

Saves are asynchronous: `save` returns once the arrays are copied to host memory; Orbax writes
them in a background thread into a temporary directory that it renames when complete, and then
a finishing thread writes the step's manifest (and on `s3://` uploads the step, see
s3_mirror.py). A step is *committed* once its manifest is written: only then does `poll` report
it, and a save that fails is reported by the next `poll`, `save` or `wait` as one
CheckpointSaveError naming the cause and the last good step.

Readers (eval, sample, infer, `checkpoint info`, init_from, to-hf, config diff) open the
directory with `read_only=True`: they never delete, clean up or write anything in it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

from t5x_lite import storage
from t5x_lite.checkpoints import manifest, orbax_noise
from t5x_lite.checkpoints.compatibility import (  # noqa: F401 - re-exported: callers name them checkpoint.X
    CheckpointMismatchError,
    check_compatible,
    check_same_structure,
    checkpoints_dir,
    structure_differences,
)
from t5x_lite.checkpoints.retention import RetentionPolicy, steps_to_keep

# One name for the checkpoints' folder, shared with the s3 mirror's layout.
from t5x_lite.checkpoints.s3_mirror import CHECKPOINTS as CHECKPOINTS_SUBDIR
from t5x_lite.checkpoints.s3_mirror import S3Mirror
from t5x_lite.errors import UserError
from t5x_lite.parallel import distributed

DAMAGED_SUBDIR = "checkpoints_damaged"
# Orbax writes step N into "N.orbax-checkpoint-tmp" (and on some versions a suffix) until it is complete.
TMP_MARKER = ".orbax-checkpoint-tmp"


class NoUsableCheckpointError(UserError, ValueError):
    """Checkpoints exist but none of them can be restored; nothing was changed."""


class CheckpointSaveError(UserError, RuntimeError):
    """A save failed (a full disk, a quota, permissions, an unreachable endpoint); earlier steps are intact."""


class Checkpointer:
    """Saves and restores steps of a run in `model_dir` (local, `gs://` or `s3://`).

    Args:
      model_dir: the run's directory.
      retention: which checkpoints survive a new save (see retention.py).
      read_only: only read what is there: no directory created, no temporary directory cleaned
        up, no retention applied, nothing written (every reader; the trainer holds the lease).
      async_save: write in a background thread (False: `save` returns when the step is committed).
    """

    def __init__(self, model_dir: str, *, retention: RetentionPolicy = RetentionPolicy(), read_only: bool = False,
                 async_save: bool = True):
        self.model_dir = storage.absolute(os.fspath(model_dir))
        self.read_only = read_only
        self._mirror = S3Mirror(self.model_dir, read_only=read_only) if storage.is_s3(self.model_dir) else None
        # Where files are written: the model directory itself, or the staging copy of an s3 one.
        self.work_dir = self._mirror.local_dir if self._mirror else self.model_dir
        self._retention = retention
        self._async = async_save
        self._metrics: dict[int, dict[str, float]] = {}
        self._remote_steps: list[int] | None = None
        self._checked: dict[tuple[int, bool], manifest.StepState] = {}
        self._finisher: _Finisher | None = None
        self._unreported: list[int] = []  # committed steps that poll/wait have not returned yet
        self._failed = False  # a save failed and was reported as CheckpointSaveError
        if self._mirror:
            self._remote_steps = self._mirror.committed_steps()
            if not read_only:
                self._mirror.drop_uncommitted_local_steps(self._remote_steps)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None, create=not read_only, read_only=read_only, enable_async_checkpointing=async_save,
            cleanup_tmp_directories=not read_only)
        # Handlers named up front, so that metadata (shapes, dtypes) can be read before any restore.
        handlers = {"state": ocp.StandardCheckpointHandler(), "data_iterator": ocp.JsonCheckpointHandler(),
                    "metadata": ocp.JsonCheckpointHandler(), "config": ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(storage.join(self.work_dir, CHECKPOINTS_SUBDIR), options=options,
                                              item_handlers=handlers)

    # -- listing ---------------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        """Steps that Orbax committed, ascending (a step's manifest may still be being written:
        `check` tells)."""
        if self._mirror:
            return list(self._remote_steps)
        pending = self._finisher.step if self._finisher and not self._finisher.done else None
        return sorted(s for s in self._manager.all_steps() if s != pending)

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def step_dir(self, step: int) -> str:
        return storage.join(self.work_dir, CHECKPOINTS_SUBDIR, str(step))

    def check(self, step: int, *, sizes_only: bool = False) -> manifest.StepState:
        """The step's state (good / damaged / incomplete / unverified), reading every file once
        per Checkpointer (on s3 the step is downloaded first); `sizes_only`: see manifest.check."""
        key = (step, sizes_only)
        if key not in self._checked:
            try:
                self._ready(step)
                self._checked[key] = manifest.check(self.step_dir(step), step=step, sizes_only=sizes_only)
            except Exception as e:  # noqa: BLE001 - a step that cannot even be listed or fetched is damaged
                self._checked[key] = manifest.StepState(step, manifest.DAMAGED, _one_line(e))
        return self._checked[key]

    def temporary_steps(self) -> list[tuple[int, str]]:
        """(step, directory) of Orbax's temporary step directories: saves in progress, or left by a
        save that was interrupted (local and gs:// directories; an s3 run stages them locally)."""
        root = storage.join(self.work_dir, CHECKPOINTS_SUBDIR)
        if not storage.exists(root):
            return []
        found = []
        for name in storage.listdir(root):
            name = name.rstrip("/")
            head = name.split(TMP_MARKER)[0]
            if TMP_MARKER in name and head.isdigit():
                found.append((int(head), storage.join(root, name)))
        return sorted(found)

    # -- saving ----------------------------------------------------------------------------------

    def save(self, step: int, *, state: Any, iterator_state: dict, metadata: dict, config_text: str = "",
             metrics: dict[str, float] | None = None) -> float:
        """Starts saving `step`; returns the seconds the caller was blocked.

        Waits for the previous save first, and raises CheckpointSaveError if it failed (a full
        disk, an unreachable bucket): a failed save never replaces an earlier checkpoint.
        """
        if self.read_only:
            raise RuntimeError(f"{self.model_dir} was opened read-only")
        start = time.perf_counter()
        orbax_noise.quiet_closed_loop_reports()
        self._join_finisher()
        if self._mirror:
            self._drop_staged_steps_before(step)
        metrics = {k: float(v) for k, v in (metrics or {}).items()}
        try:
            self._manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data_iterator=ocp.args.JsonSave(iterator_state),
                metadata=ocp.args.JsonSave({**metadata, "step": step, "metrics": metrics, "manifest": True}),
                config=ocp.args.JsonSave({"gin": config_text}),
            ))
        except Exception as e:  # noqa: BLE001 - reported as one line, naming the cause
            raise self._save_failed(step, e) from None
        self._metrics[step] = metrics
        self._finisher = _Finisher(step, lambda: self._finish(step))
        if self._async:
            self._finisher.start()
        else:
            self._finisher.run()
        if not self._mirror:
            self._apply_retention(in_flight=step)
        return time.perf_counter() - start

    def _finish(self, step: int) -> None:
        """In the finishing thread: waits for Orbax's commit, writes the manifest (the chief), and on
        s3 uploads the step and applies retention there."""
        self._manager.wait_until_finished()
        self._manager.check_for_errors()
        if not os.path.isdir(self.step_dir(step)) and not storage.is_url(self.work_dir):
            raise OSError(f"Orbax did not commit step {step} (no {self.step_dir(step)})")
        if distributed.is_chief():
            manifest.write(self.step_dir(step), step=step)
        if self._mirror:
            self._mirror.upload(step)
            self._committed_on_s3(step)

    def poll(self) -> list[int]:
        """The steps committed since the last call of `poll` or `wait` (none while a save is in
        flight); raises CheckpointSaveError when a save failed. Never blocks."""
        if self._finisher is not None and self._finisher.done:
            self._join_finisher()
        committed, self._unreported = self._unreported, []
        return committed

    def _join_finisher(self) -> None:
        finisher, self._finisher = self._finisher, None
        if finisher is None:
            return
        finisher.join()
        if finisher.error is not None:
            raise self._save_failed(finisher.step, finisher.error)
        self._unreported.append(finisher.step)

    def _save_failed(self, step: int, error: BaseException) -> CheckpointSaveError:
        """One line naming the cause and the last good step; the failed step's partial files removed."""
        self._failed = True
        for partial_step, partial in self.temporary_steps():
            if partial_step == step:
                storage.remove_tree(partial)
        try:
            self._manager.reload()
            earlier = [s for s in self.all_steps() if s < step]
        except Exception:  # noqa: BLE001 - the directory may be unreadable too; say so below
            earlier = []
        last = f"step {earlier[-1]} is the last good checkpoint" if earlier else "there is no earlier checkpoint"
        return CheckpointSaveError(
            f"saving the checkpoint of step {step} in {checkpoints_dir(self.model_dir)} failed: {_one_line(error)}. "
            f"Nothing earlier was changed ({last}). Fix the cause (free disk space, check quota, permissions or the "
            "storage endpoint) and run the same command again to resume.")

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
        """Runs in the finishing thread once `step` is committed: retention over the steps on s3."""
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

    def wait(self) -> list[int]:
        """Blocks until the save in flight is committed (on s3: uploaded); returns the steps
        committed since the last `poll` or `wait`, or raises CheckpointSaveError."""
        self._join_finisher()
        if not self.read_only and not self._mirror and self._manager.all_steps():
            self._apply_retention()
        committed, self._unreported = self._unreported, []
        return committed

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
                       shapes: Any = None, shardings: Any = None) -> Any:
        """The parameters of a step, whatever mesh saved them: on this process's first device, or
        read straight into `shardings` (a tree of shardings like the params; each process reads
        only the pieces its devices hold).

        `only('decoder/layers/attention/query/kernel')` picks which arrays are read (a converter
        reads a checkpoint one array at a time this way); the others are left out of the tree.
        `shapes`: the step's `state_shapes()["params"]`, when the caller already has them (reading
        them takes longer than restoring a small array).
        """
        self._ready(step)
        shapes = self.state_shapes(step)["params"] if shapes is None else shapes
        if shardings is None:
            device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            shardings = jax.tree.map(lambda _: device, shapes)
        target = jax.tree.map(lambda m, s: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=s), shapes, shardings)
        if only is not None:
            target = _select(target, only)
        # A partial restore (the optimizer state is not read) needs the PyTree handler itself.
        with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as reader:
            restored = reader.restore(
                self._manager.directory / str(step) / "state",
                args=ocp.args.PyTreeRestore(item={"params": target}, partial_restore=True, restore_args=jax.tree.map(
                    lambda t: ocp.ArrayRestoreArgs(sharding=t.sharding), {"params": target})))
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
        is not damage: it stops the run). Returns None when there is no checkpoint, or when every
        one is incomplete for want of its manifest alone (a run killed before its first save
        finished: those are moved aside, as nothing finished was ever saved), and raises
        NoUsableCheckpointError (moving nothing) when there are some but none restores.
        """
        damaged: list[tuple[int, str, str]] = []  # (step, state, why)
        unfinished = set()  # steps whose manifest alone is missing (`manifest_due`)
        for step in reversed(self.all_steps()):
            found = self.check(step)
            if not found.readable:
                damaged.append((step, found.state, found.reason))
                if found.manifest_due:
                    unfinished.add(step)
                continue
            try:
                metadata = self.metadata(step)
            except Exception as e:  # noqa: BLE001 - any failure to read means damage
                damaged.append((step, manifest.DAMAGED, _one_line(e)))
                continue
            check(metadata)
            check_same_structure(self.state_shapes(step), abstract_state, step=step, model_dir=self.model_dir)
            try:
                state, iterator_state, metadata = self.restore(step, abstract_state=abstract_state)
            except Exception as e:  # noqa: BLE001
                damaged.append((step, manifest.DAMAGED, _one_line(e)))
                continue
            self._move_all_aside(damaged, warn=warn, then=f" and restored step {step} instead.")
            return step, state, iterator_state, metadata
        if damaged and all(step in unfinished for step, _, _ in damaged):
            self._move_all_aside(damaged, warn=warn, then=". No save of this run had finished: starting from step 0.")
            return None
        if damaged:
            raise NoUsableCheckpointError(
                f"None of the checkpoints in {checkpoints_dir(self.model_dir)} can be restored:\n  "
                + "\n  ".join(f"step {s}: {kind} ({r})" for s, kind, r in damaged)
                + "\nNothing was changed. Move the directory away to start afresh, or copy a good "
                "checkpoint back into it.")
        return None

    def _move_all_aside(self, damaged: list[tuple[int, str, str]], *, warn: Callable[[str], None],
                        then: str) -> None:
        """Moves each (step, state, why) aside with one warning, which ends with `then`."""
        for bad, bad_state, reason in damaged:
            where = self.move_aside(bad)
            warn(f"WARNING: the checkpoint at step {bad} is {bad_state} ({reason}); moved it to {where}{then}")

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
        """Waits for the save in flight, then releases Orbax's threads (a failed save is raised by
        `wait`; `close` after it releases without raising it again)."""
        try:
            self.wait()
        finally:
            try:
                self._manager.close()
            except Exception:  # noqa: BLE001 - Orbax raises a failed save again; it was reported already
                if not self._failed:
                    raise
            if self._mirror and self.read_only:
                shutil.rmtree(self._mirror.local_dir, ignore_errors=True)  # a reader's own downloads


class _Finisher:
    """Runs a save's finishing work (`work`) once, in a thread or inline, and keeps its error."""

    def __init__(self, step: int, work: Callable[[], None]):
        self.step, self._work = step, work
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()

    def run(self) -> None:
        try:
            self._work()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread by join()
            self.error = e
        finally:
            self._done.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"checkpoint-finish-{self.step}", daemon=True)
        self._thread.start()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()


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


# Causes a user can act on, found anywhere in an error's text or its chain (Orbax and TensorStore
# wrap the OS error in several layers of their own).
KNOWN_CAUSES = ("No space left on device", "Disk quota exceeded", "Permission denied", "Read-only file system",
                "Connection refused", "Could not connect", "Name or service not known", "Access Denied",
                "NoSuchBucket", "File too large")


def _one_line(error: BaseException) -> str:
    """The error in one line of at most 300 characters, led by a known cause when there is one."""
    text = f"{type(error).__name__}: {error}".strip()
    first = (text.splitlines()[0] if text else type(error).__name__)[:300]
    chain, seen = [], error
    while seen is not None and len(chain) < 10:
        chain.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    whole = "\n".join(chain).lower()
    cause = next((c for c in KNOWN_CAUSES if c.lower() in whole), None)
    return f"{cause} ({first})" if cause and cause.lower() not in first.lower() else first


def to_saveable(state: Any, dropout_rng: jax.Array) -> dict:
    """The train state as a plain dict tree (what Orbax writes), with the dropout RNG key."""
    return {"step": state.step, "params": state.params, "opt_state": state.opt_state, "dropout_rng": dropout_rng}
