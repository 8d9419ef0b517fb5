"""`t5x-lite convert from-hf|to-hf`: Hugging Face checkpoints in and out (docs/interop.md).

    t5x-lite convert from-hf --model_dir=HF_FOLDER --out=MODEL_DIR [--scan_layers=false]
    t5x-lite convert to-hf --checkpoint=MODEL_DIR_OR_STEP_DIR --out=HF_FOLDER [--step=N] [--dtype=bfloat16]
"""

from __future__ import annotations

import argparse
import re
from typing import Sequence

from t5x_lite import errors, host_memory
from t5x_lite.hf import convert
from t5x_lite.hf.convert import DEFAULT_MAX_SHARD_BYTES, OUTPUT_DTYPES

USAGE = __doc__.split("\n\n", 1)[1].rstrip()
_SIZE = re.compile(r"(\d+)\s*([KMG]?B)?", re.IGNORECASE)
_UNITS = {None: 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_size(text: str) -> int:
    """'5GB' -> 5_000_000_000 (decimal units, as transformers' max_shard_size)."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"expected a size such as 5GB, 500MB or a number of bytes, got {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2).upper() if match.group(2) else None]


def main(argv: Sequence[str] | None = None) -> int:

    parser = argparse.ArgumentParser(prog="t5x-lite convert", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=USAGE)
    sub = parser.add_subparsers(dest="direction", required=True)
    from_hf = sub.add_parser("from-hf", help="a Hugging Face folder -> a t5x_lite model directory")
    from_hf.add_argument("--model_dir", required=True,
                         help="local Hugging Face model folder (config.json + model.safetensors or its shards)")
    from_hf.add_argument("--out", required=True, help="the t5x_lite model directory to write (local, gs://, s3://)")
    from_hf.add_argument("--scan_layers", type=parse_bool, default=True,
                         help="stack the layers on one axis (default true); false writes one subtree per layer")
    to_hf = sub.add_parser("to-hf", help="a t5x_lite checkpoint -> a Hugging Face folder")
    to_hf.add_argument("--checkpoint", required=True,
                       help="a model directory (its latest step unless --step) or MODEL_DIR/checkpoints/<step>")
    to_hf.add_argument("--out", required=True, help="the Hugging Face folder to write (local; must not exist yet)")
    to_hf.add_argument("--step", type=int, default=None, help="which step of a model directory")
    to_hf.add_argument("--dtype", choices=OUTPUT_DTYPES, default="float32", help="tensor dtype in the files")
    to_hf.add_argument("--max_shard_size", type=parse_size, default=DEFAULT_MAX_SHARD_BYTES,
                       help="largest safetensors file before the weights are split into shards (default 5GB)")
    args = parser.parse_args(argv)
    with errors.reported():
        if args.direction == "from-hf":
            gin_path = convert.from_hf(args.model_dir, args.out, scan_layers=args.scan_layers)
            print(f"Model gin file: {gin_path}")
        else:
            convert.to_hf(args.checkpoint, args.out, step=args.step, dtype=args.dtype,
                          max_shard_bytes=args.max_shard_size)
    return 0


if __name__ == "__main__":
    host_memory.run_program(main)
