"""Orbax checkpoints of the full train state, the data iterator, and the run's metadata.

Layout of a model directory:

    MODEL_DIR/config.gin              the resolved gin config of the latest run
    MODEL_DIR/vocab/spm.model         the vocabulary, so the directory is self-contained
    MODEL_DIR/checkpoints/<step>/     state (params, opt_state, step; always float32),
                                      data_iterator (JSON), metadata (JSON: model, task, mesh)

Orbax writes each step to a temporary directory and renames it when complete, so a
checkpoint that exists is a whole one.
"""

from __future__ import annotations

import os
from typing import Any

import orbax.checkpoint as ocp

CHECKPOINTS_SUBDIR = "checkpoints"


class CheckpointMismatchError(ValueError):
    """The model directory holds checkpoints of a different model."""


def checkpoints_dir(model_dir: str) -> str:
    return os.path.join(os.path.abspath(model_dir), CHECKPOINTS_SUBDIR)


class Checkpointer:
    """Saves and restores (state, iterator state, metadata) at steps, keeping the last `keep`."""

    def __init__(self, model_dir: str, *, keep: int = 3, create: bool = True):
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=create)
        self._manager = ocp.CheckpointManager(
            checkpoints_dir(model_dir), options=options,
            item_names=("state", "data_iterator", "metadata"),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, *, state: Any, iterator_state: dict, metadata: dict) -> None:
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data_iterator=ocp.args.JsonSave(iterator_state),
                metadata=ocp.args.JsonSave(metadata),
            ),
        )

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def restore(self, step: int, *, abstract_state: Any) -> tuple[Any, dict, dict]:
        """Restores into `abstract_state`'s shapes, dtypes and shardings."""
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state),
                data_iterator=ocp.args.JsonRestore(),
                metadata=ocp.args.JsonRestore(),
            ),
        )
        return restored["state"], restored["data_iterator"], restored["metadata"]

    def restore_params(self, step: int) -> Any:
        """Only the parameters of a step, as saved (no target shapes or shardings needed)."""
        restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
        return restored["state"]["params"]

    def metadata(self, step: int) -> dict:
        return self._manager.restore(step, args=ocp.args.Composite(metadata=ocp.args.JsonRestore()))["metadata"]

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


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


def to_saveable(state: Any) -> dict:
    """The train state as a plain dict tree (what Orbax writes)."""
    return {"step": state.step, "params": state.params, "opt_state": state.opt_state}
