"""Whether a checkpoint fits this run: the saved model's fields and the train state's arrays.

Tells a changed configuration (another model, another optimizer, other sizes) apart from a
damaged file, and names each field or array that differs.
"""

from __future__ import annotations

from typing import Any

import jax

from t5x_lite import storage
from t5x_lite.checkpoints.s3_mirror import CHECKPOINTS
from t5x_lite.errors import UserError
from t5x_lite.models import BaseModel


class CheckpointMismatchError(UserError, ValueError):
    """The model directory holds checkpoints of a different model."""


def checkpoints_dir(model_dir: str) -> str:
    return storage.join(storage.absolute(model_dir), CHECKPOINTS)


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


def _with_defaults(family: Any, model: dict) -> dict:
    """A saved model's fields, with the default of each field its config class gained since it was saved."""
    return {**BaseModel.field_defaults(family), **model}


def check_compatible(saved: dict, current: dict, *, model_dir: str) -> None:
    """Raises CheckpointMismatchError naming each model field that differs."""
    saved_model = _with_defaults(saved.get("family"), saved.get("model", {}))
    current_model = _with_defaults(current.get("family"), current.get("model", {}))
    # Fields that change the parameter tree; switches like remat do not.
    keys = sorted(set(saved_model) | set(current_model))
    switches = ("dtype", "remat_policy", "dropout_rate", "scan_layers", "scan_unroll", "cudnn_segments_per_row")
    shape_fields = [k for k in keys if k not in switches]
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
