"""`t5x-lite checkpoint verify MODEL_DIR`: the state of every step of a model directory.

Each committed step is checked against its manifest (manifest.py: sizes and CRC32C of every
file), and Orbax's temporary directories are reported as `in progress` while a live trainer
holds the directory's lease (lease.py) and as `incomplete` otherwise. A step without a manifest
is `incomplete` too when its metadata promises one, or when it lacks the Orbax metadata a reader
starts from (an interrupted copy): manifest.check, the rule every reader uses. Reads only.
Exit status: 0 when no step is damaged or incomplete, 1 when one is, 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from t5x_lite import errors, storage
from t5x_lite.checkpoints import checkpoint, lease, manifest
from t5x_lite.checkpoints.lookup import CheckpointNotFoundError

USAGE = "t5x-lite checkpoint verify MODEL_DIR [--step N] [--sizes_only]"
EXIT_DAMAGE_FOUND = 1


def directory_states(model_dir: str, *, sizes_only: bool = False, steps: Sequence[int] | None = None
                     ) -> list[manifest.StepState]:
    """Every step's state, ascending, temporary directories included (`steps`: only these)."""
    model_dir = storage.absolute(model_dir)
    reader = checkpoint.Checkpointer(model_dir, read_only=True)
    try:
        states = [reader.check(s, sizes_only=sizes_only) for s in reader.all_steps()
                  if steps is None or s in steps]
        temporary = reader.temporary_steps()
    finally:
        reader.close()
    if temporary:
        holder = lease.live_holder(model_dir)
        for step, path in temporary:
            if steps is not None and step not in steps:
                continue
            if holder is not None:
                states.append(manifest.StepState(step, manifest.IN_PROGRESS, f"being written by {holder.describe()}",
                                                 temporary=True))
            else:
                states.append(manifest.StepState(
                    step, manifest.INCOMPLETE, f"{path} is left by a save that was interrupted; the next "
                    "`train` in this directory removes it", temporary=True))
    return sorted(states, key=lambda s: (s.step, s.temporary))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="t5x-lite checkpoint verify", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", help="a model directory (local, gs:// or s3://)")
    parser.add_argument("--step", type=int, action="append", help="check only this step (repeatable)")
    parser.add_argument("--sizes_only", action="store_true",
                        help="compare file sizes only, without reading the bytes (quick)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    with errors.reported():
        states = directory_states(args.model_dir, sizes_only=args.sizes_only, steps=args.step)
        if not states:
            raise CheckpointNotFoundError(f"no checkpoint in {checkpoint.checkpoints_dir(args.model_dir)}"
                                          + (f" at step(s) {args.step}" if args.step else "") + ".")
    for state in states:
        print(state.describe())
    bad = [s for s in states if s.state in (manifest.DAMAGED, manifest.INCOMPLETE)]
    what = "file sizes" if args.sizes_only else "sizes and CRC32C"
    print(f"{len(states)} step(s) checked ({what}): " + (
        f"{len(bad)} damaged or incomplete" if bad else "none damaged or incomplete"))
    return EXIT_DAMAGE_FOUND if bad else 0
