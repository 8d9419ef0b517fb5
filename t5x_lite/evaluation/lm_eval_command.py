"""`t5x-lite lm-eval`: lm-evaluation-harness's own command line, with the `t5x_lite` model registered.

    t5x-lite lm-eval --model_args model_dir=runs/quickstart --tasks hellaswag --limit 10
    t5x-lite lm-eval --model_args model_dir=runs/quickstart,step=300 --tasks my_task --include_path my_tasks/

Every flag is lm-eval's (`lm-eval run --help`). `--model t5x_lite` is added when no --model is
given, and `--batch_size 8` when no --batch_size (model_args' batch_size wins over both);
`ls` and `validate` pass through unchanged. lm-eval 0.4.13 finds models only in its own package,
so a plain `lm-eval --model t5x_lite` cannot: this command imports lm_eval_model.py first.

The model_args are checked, and the checkpoint located, before lm-eval loads its tasks: a
missing model_dir or a step without a good checkpoint is one line on stderr and exit status 2,
and so is a task lm-eval does not know (`t5x-lite lm-eval ls tasks` lists them).
lm-eval is imported only when the command runs, so `t5x-lite --help` stays fast.
"""

from __future__ import annotations

import sys
from typing import Sequence

from t5x_lite import errors, host_memory
from t5x_lite.checkpoints import lookup

MODEL = "t5x_lite"
PASS_THROUGH = ("ls", "validate")  # lm-eval's other subcommands
_TASKS_NOT_FOUND = "Tasks not found:"  # how lm-eval 0.4 refuses --tasks it cannot find
USAGE = ("usage: t5x-lite lm-eval --model_args model_dir=DIR[,step=N,batch_size=8,max_gen_toks=256,seed=0] "
         "--tasks TASK [lm-eval run flags]")


class LmEvalMissingError(errors.UserError):
    """lm-evaluation-harness is not installed."""


class UnknownTaskError(errors.UserError):
    """--tasks names a task lm-eval cannot find."""


def _has_flag(argv: Sequence[str], *names: str) -> bool:
    return any(arg in names or arg.startswith(tuple(f"{name}=" for name in names)) for arg in argv)


def lm_eval_argv(argv: Sequence[str], *, batch_size: int) -> list[str]:
    """lm-eval's arguments for ours: `run` with --model t5x_lite and --batch_size unless given."""
    argv = list(argv)
    if argv[:1] and argv[0] in PASS_THROUGH:
        return argv
    rest = argv[1:] if argv[:1] == ["run"] else argv
    if not _has_flag(rest, "--model", "-M"):
        rest += ["--model", MODEL]
    if not _has_flag(rest, "--batch_size", "-b"):
        rest += ["--batch_size", str(batch_size)]
    return ["run", *rest]


def _import_lm_eval():
    try:
        from lm_eval._cli import HarnessCLI
        from lm_eval.utils import setup_logging

        from t5x_lite.evaluation import lm_eval_model  # registers the model `t5x_lite`
    except ImportError as e:
        if (e.name or "").split(".")[0] != "lm_eval":
            raise
        raise LmEvalMissingError("lm-evaluation-harness is not installed: run `make install-tracking` (the pinned "
                                 "lm_eval and its dependencies, requirements/tracking.txt).") from None
    return HarnessCLI, setup_logging, lm_eval_model


def check_model_args(namespace, lm_eval_model) -> None:
    """Our model_args, typed, and the checkpoint they name: a clear error before lm-eval loads any task."""
    if getattr(namespace, "command", None) != "run" or getattr(namespace, "model", None) != MODEL:
        return
    if getattr(namespace, "config", None):  # model_args may come from the YAML file: the model checks them
        return
    args = lm_eval_model.parse_model_args(dict(getattr(namespace, "model_args", None) or {}))
    lookup.locate(args.model_dir, args.step)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with errors.reported():
        harness_cli, setup_logging, lm_eval_model = _import_lm_eval()
        if not argv:
            print(f"{USAGE}\n(`t5x-lite lm-eval --help` lists lm-eval's flags)", file=sys.stderr)
            return errors.EXIT_BAD_INPUT
        if _has_flag(argv, "-h", "--help"):
            print(f"{USAGE}\n(lm-evaluation-harness with --model t5x_lite; lm-eval's own flags follow)\n")
        setup_logging()
        parser = harness_cli()
        saved, sys.argv = sys.argv, ["lm-eval", *lm_eval_argv(argv, batch_size=lm_eval_model.DEFAULT_BATCH_SIZE)]
        try:
            namespace = parser.parse_args()  # lm-eval's parser reads sys.argv
        finally:
            sys.argv = saved
        check_model_args(namespace, lm_eval_model)
        try:
            parser.execute(namespace)
        except ValueError as e:
            unknown = _unknown_task(e)
            if unknown is None:
                raise
            raise unknown from None
    return 0


def _unknown_task(error: ValueError) -> UnknownTaskError | None:
    """lm-eval's "Tasks not found: a, b" (lm_eval/config/evaluate_config.py) as one line naming the fix."""
    message = str(error)
    if not message.startswith(_TASKS_NOT_FOUND):
        return None
    names = message[len(_TASKS_NOT_FOUND):].strip()
    return UnknownTaskError(f"lm-eval has no task {names}: `t5x-lite lm-eval ls tasks` lists them, and "
                            "--include_path DIR adds tasks of your own (YAML files).")


if __name__ == "__main__":
    host_memory.run_program(main)
