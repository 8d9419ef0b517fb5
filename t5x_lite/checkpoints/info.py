"""`t5x-lite checkpoint info PATH`: what a checkpoint holds, read without loading its arrays.

PATH is a model directory (local, gs:// or s3://; its newest good step unless --step) or a step
directory MODEL_DIR/checkpoints/<step>. Prints the model, task, mesh and metrics saved with
the step, the data iterator's position, the arrays (count, parameters, bytes) and the state of
every step (good / damaged / incomplete / in progress: the described step's bytes are checked,
the others' file sizes; `checkpoint verify` reads them all); --config prints the resolved gin
config the step was trained with instead. Reads only: a running trainer is never disturbed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

import jax
import numpy as np

from t5x_lite import errors, host_memory
from t5x_lite.checkpoints import checkpoint, lookup, verify

USAGE = "t5x-lite checkpoint info PATH [--step N] [--config]"


def _array_summary(shapes: Any) -> dict[str, tuple[int, int, int]]:
    """{'params': (arrays, elements, bytes), 'opt_state': ...} from the saved array metadata."""
    summary = {}
    for group, tree in shapes.items():
        leaves = [leaf for leaf in jax.tree.leaves(tree) if hasattr(leaf, "shape")]
        elements = sum(int(np.prod(leaf.shape)) for leaf in leaves)
        nbytes = sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in leaves)
        summary[group] = (len(leaves), elements, nbytes)
    return summary


def describe(path: str, step: int | None = None) -> dict[str, Any]:
    """Everything `info` prints, as a dict (tested directly)."""

    model_dir, step = lookup.locate(path, step)
    checkpointer = checkpoint.Checkpointer(model_dir, read_only=True)
    try:
        metadata = checkpointer.metadata(step)
        return {
            "model_dir": model_dir,
            "step": step,
            "steps_present": checkpointer.all_steps(),
            # The steps from the newest to the one described are read whole (as the reader's own
            # choice of step was); older ones by their file sizes only.
            "states": [checkpointer.check(s.step) if s.step >= step and not s.temporary else s
                       for s in verify.directory_states(model_dir, sizes_only=True)],
            "metadata": metadata,
            "data_iterator": checkpointer.iterator_state(step),
            "arrays": _array_summary(checkpointer.state_shapes(step)),
            "config": checkpointer.config_text(step),
        }
    finally:
        checkpointer.close()


def format_info(info: dict[str, Any]) -> str:
    metadata = dict(info["metadata"])
    model = metadata.pop("model", {})
    lines = [f"checkpoint: {info['model_dir']} step {info['step']}",
             f"steps present: {info['steps_present']}",
             *[f"  {state.describe()}" + (" (sizes checked)" if state.step < info["step"] and state.state == "good"
                                          else "") for state in info["states"]],
             f"family: {metadata.pop('family', '?')}",
             "model: " + ", ".join(f"{k}={v}" for k, v in model.items())]
    for key in ("attention", "task", "vocab_size", "sequence_length", "num_params", "mesh_axes"):
        if key in metadata:
            lines.append(f"{key}: {metadata.pop(key)}")
    lines.append(f"metrics: {json.dumps(metadata.pop('metrics', {}))}")
    lines.append(f"data iterator: {json.dumps(info['data_iterator'])}")
    for group, (arrays, elements, nbytes) in info["arrays"].items():
        lines.append(f"{group}: {arrays} arrays, {elements:,} values, {nbytes / 2**20:.2f} MiB")
    lines.append("config: saved (print it with --config)" if info["config"] else "config: not saved")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="t5x-lite checkpoint info", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a model directory or MODEL_DIR/checkpoints/<step>")
    parser.add_argument("--step", type=int, default=None, help="which step of a model directory (default: newest good)")
    parser.add_argument("--config", action="store_true", help="print the step's resolved gin config")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    with errors.reported():
        info = describe(args.path, args.step)
        if args.config:
            print(info["config"] or f"# step {info['step']} was saved without its config")
        else:
            print(format_info(info))
    return 0


if __name__ == "__main__":
    host_memory.run_program(main)
