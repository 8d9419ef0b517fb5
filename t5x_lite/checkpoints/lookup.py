"""Finding the checkpoint a reader asked for: a step that is whole, or one clear error.

Every reader (eval, sample, infer, `checkpoint info`, init_from, to-hf, config diff) starts
here. A model directory gives its newest *good* step (manifest.py): a damaged or incomplete
newer step is skipped with one warning each. A step named explicitly must be good, or the
reader stops naming it. Nothing is written, deleted or cleaned up.
"""

from __future__ import annotations

import os
import posixpath
import sys
from typing import Callable

from t5x_lite import storage
from t5x_lite.checkpoints.checkpoint import CHECKPOINTS_SUBDIR, Checkpointer, checkpoints_dir
from t5x_lite.errors import UserError


class CheckpointNotFoundError(UserError, ValueError):
    """The path or step named holds no checkpoint."""


class DamagedCheckpointError(UserError, ValueError):
    """The step asked for is damaged or incomplete (its manifest does not match its files)."""


def _warn_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def require_model_dir(path: str | None, reader: str) -> None:
    """A CheckpointNotFoundError when a gin-configured reader (eval, infer) was given no checkpoint."""
    if not path:
        raise CheckpointNotFoundError(
            f"{reader} needs a checkpoint: set MODEL_DIR (a training run's directory, or one step's directory "
            "MODEL_DIR/checkpoints/<step>) or t5x's name for it, CHECKPOINT_PATH; e.g. "
            "--gin.MODEL_DIR=\"'runs/quickstart'\".")


def locate(path: str, step: int | None = None, *,
           warn: Callable[[str], None] = _warn_to_stderr) -> tuple[str, int]:
    """(model directory, step) of a checkpoint that is whole, for readers.

    `path` is a model directory (its newest good step unless `step`; a damaged or incomplete
    newer step is skipped with one warning each) or a step directory MODEL_DIR/checkpoints/<step>.
    A step named explicitly that is not good raises DamagedCheckpointError naming it; no
    checkpoint at all raises CheckpointNotFoundError naming what exists. Writes nothing.
    """
    path = storage.absolute(os.fspath(path)).rstrip("/")
    split = posixpath.split if storage.is_url(path) else os.path.split
    parent, name = split(path)
    if name.isdigit() and split(parent)[1] == CHECKPOINTS_SUBDIR:
        if step is not None and step != int(name):
            raise CheckpointNotFoundError(f"{path} is the checkpoint of step {name}, not of step {step}.")
        path, step = split(parent)[0], int(name)
    checkpointer = Checkpointer(path, read_only=True)
    try:
        steps = checkpointer.all_steps()
        if not steps:
            raise CheckpointNotFoundError(
                f"no checkpoint in {path}; name a model directory with checkpoints/ (a trained run's MODEL_DIR) "
                "or a step directory MODEL_DIR/checkpoints/<step>.")
        if step is not None:
            if step not in steps:
                raise CheckpointNotFoundError(f"no checkpoint at step {step} in {path}; available: {steps}.")
            state = checkpointer.check(step)
            if not state.readable:
                raise DamagedCheckpointError(
                    f"the checkpoint at step {step} in {checkpoints_dir(path)} is {state.state}: {state.reason}. "
                    f"Name another step (`t5x-lite checkpoint verify {path}` lists each step's state).")
            return path, step
        skipped = []
        for candidate in reversed(steps):
            state = checkpointer.check(candidate)
            if state.readable:
                for bad in skipped:
                    warn(f"WARNING: skipping the checkpoint at {bad.describe()}; using step {candidate}.")
                return path, candidate
            skipped.append(state)
        raise DamagedCheckpointError(
            f"no checkpoint in {checkpoints_dir(path)} is whole:\n  " + "\n  ".join(s.describe() for s in skipped))
    finally:
        checkpointer.close()
