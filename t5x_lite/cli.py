"""The `t5x-lite` command: one entry point for every job.

    t5x-lite prepare --input=PATH --out=DIR      text/jsonl -> SentencePiece vocab + TFRecords
    t5x-lite index DATA_DIR                      write the offset index of a directory prepared without one
    t5x-lite cache --gin_file=FILE --output_cache_dir=DIR   preprocess tasks offline (Apache Beam)
    t5x-lite train --gin_file=FILE ...           train (same flags as python -m t5x_lite.train)
    t5x-lite eval --gin_file=runs/eval.gin ...   perplexity, multiple choice, seqio metrics of checkpoints
    t5x-lite infer --gin_file=runs/infer.gin ... prompts -> jsonl of outputs (resumable, sharded)
    t5x-lite lm-eval --model_args model_dir=DIR --tasks T ...   lm-evaluation-harness tasks on a checkpoint
    t5x-lite sample --model_dir=DIR --prompt=T   generate from a checkpoint
    t5x-lite checkpoint info|verify|unlock PATH  what a step holds; each step's state; a dead run's lease
    t5x-lite config show|explain|diff|reference  the resolved config, where each value came from, diffs
    t5x-lite estimate --gin_file=FILE ...        parameters, FLOPs, memory and time before you spend compute
    t5x-lite launch slurm --gin_file=FILE --nodes=N ...   render and submit a SLURM job (--dry-run prints it)
    t5x-lite convert from-hf|to-hf ...           Hugging Face T5, GPT-2 and LLaMA checkpoints in and out
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Sequence

from t5x_lite import host_memory

COMMANDS = {
    "prepare": ("t5x_lite.data.preparation.prepare", "text/jsonl -> SentencePiece vocabulary + sharded TFRecords"),
    "index": ("t5x_lite.data.preparation.index_command", "write a prepared directory's offset index (read by index, O(1) resume)"),
    "cache": ("t5x_lite.config.cache_command", "preprocess seqio tasks offline with Apache Beam (use_cached)"),
    "train": ("t5x_lite.train", "run the gin-configured train loop"),
    "eval": ("t5x_lite.eval", "evaluate checkpoints: perplexity, multiple choice, seqio metrics"),
    "infer": ("t5x_lite.infer", "generate outputs for a jsonl of prompts or a task (resumable, sharded)"),
    "lm-eval": ("t5x_lite.evaluation.lm_eval_command", "lm-evaluation-harness on a checkpoint (--model t5x_lite)"),
    "sample": ("t5x_lite.inference.sample", "generate text from a checkpoint"),
    "checkpoint": ("t5x_lite.checkpoints.command", "`checkpoint info|verify|unlock`: a step's contents, every step's state"),
    "config": ("t5x_lite.config.command", "show / explain / diff resolved gin configs; write the reference"),
    "estimate": ("t5x_lite.estimate.command", "parameters, FLOPs, memory per device and time to train, from a gin config"),
    "launch": ("t5x_lite.cluster.command", "`launch slurm`: render and submit a multi-node SLURM job (or --dry-run)"),
    "convert": ("t5x_lite.hf.command", "`convert from-hf` / `convert to-hf`: Hugging Face checkpoints in and out"),
}


def usage() -> str:
    lines = ["usage: t5x-lite <command> [flags]   (t5x-lite <command> --help for its flags)", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}\n{usage()}", file=sys.stderr)
        return 2
    return verb_module(command).main(rest)


def verb_module(command: str) -> ModuleType:
    """The module of COMMANDS[command], imported only now (`--help` imports none) by a plain
    import, which the import graph and lint-imports see."""
    if command == "prepare":
        from t5x_lite.data.preparation import prepare as module
    elif command == "index":
        from t5x_lite.data.preparation import index_command as module
    elif command == "cache":
        from t5x_lite.config import cache_command as module
    elif command == "train":
        from t5x_lite import train as module
    elif command == "eval":
        from t5x_lite import eval as module
    elif command == "infer":
        from t5x_lite import infer as module
    elif command == "lm-eval":
        from t5x_lite.evaluation import lm_eval_command as module
    elif command == "sample":
        from t5x_lite.inference import sample as module
    elif command == "checkpoint":
        from t5x_lite.checkpoints import command as module
    elif command == "config":
        from t5x_lite.config import command as module
    elif command == "estimate":
        from t5x_lite.estimate import command as module
    elif command == "launch":
        from t5x_lite.cluster import command as module
    elif command == "convert":
        from t5x_lite.hf import command as module
    else:
        raise KeyError(command)
    return module


def run() -> None:
    """The `t5x-lite` program (pyproject's console script): `main` with host memory set up first."""
    host_memory.run_program(main)


if __name__ == "__main__":
    run()
