"""t5x's macros and what each one means here: the parameters it sets, or why it is refused.

t5x's run files (t5x/configs/runs/{pretrain,finetune,eval,infer}.gin) and model files read a
run's settings through macros: `--gin.TRAIN_STEPS=...`, `--gin.Z_LOSS=...`. Written here, each
of them means what it means in t5x: `T5X_MACROS` names the parameters this project's gin files
bind to it (the bindings themselves stand in gin/; DROPOUT_RATE's default is macro_defaults.py's),
or, for a setting that has no equivalent, what to write instead.

`check_refused` stops a run that sets a refused macro no binding reads, with one line naming
the equivalent; `unused_hint` says what a table macro sets when the run at hand reads it not.
docs/from_t5x.md's table of macros is `doc_rows()`, checked by tests/config/test_t5x_macros.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from t5x_lite.config.parsing import ConfigError
from t5x_lite.config.sources import Binding


@dataclasses.dataclass(frozen=True)
class T5xMacro:
    """What a t5x macro means here.

    Attributes:
      sets: the parameters it sets, named as `t5x-lite config show` names them
        ('LossConfig.z_loss', 'train/DataConfig.shuffle'); empty for a refused macro.
      instead: a refused macro: the binding to write instead ('' when there is nothing to set).
      why: a refused macro: why it has no equivalent here.
      same_here: values that ask for what this project always does: accepted, with nothing to bind.
      note: how it differs from t5x (for the table in docs/from_t5x.md).
    """

    sets: tuple[str, ...] = ()
    instead: str = ""
    why: str = ""
    same_here: tuple[Any, ...] = ()
    note: str = ""

    @property
    def refused(self) -> bool:
        return not self.sets


T5X_MACROS: dict[str, T5xMacro] = {
    # t5x/configs/runs/pretrain.gin and finetune.gin
    "MIXTURE_OR_TASK_NAME": T5xMacro(sets=("train/DataConfig.mixture_or_task_name",
                                           "eval/DataConfig.mixture_or_task_name",
                                           "SeqioEval.mixture_or_task_name", "infer.mixture_or_task_name"),
                                     note="also a task factory call, `@lm_task()`"),
    "MIXTURE_OR_TASK_MODULE": T5xMacro(sets=("train.task_module", "evaluate.task_module", "infer.task_module"),
                                       note="imported before the task is looked up"),
    "TASK_FEATURE_LENGTHS": T5xMacro(sets=("train/DataConfig.task_feature_lengths",
                                           "eval/DataConfig.task_feature_lengths", "infer.task_feature_lengths"),
                                     note="or `INPUTS_LENGTH` and `SEQUENCE_LENGTH`; a prefix LM's row is "
                                          "inputs + targets, as in t5x"),
    "TRAIN_STEPS": T5xMacro(sets=("train.train_steps",),
                            note="with `finetune.gin`, the fine-tuning steps alone (t5x counts the "
                                 "pre-training steps too); or `NUM_EPOCHS`"),
    "BATCH_SIZE": T5xMacro(sets=("train/DataConfig.batch_size", "eval/DataConfig.batch_size")),
    "MODEL_DIR": T5xMacro(sets=("train.model_dir", "evaluate.model_dir", "infer.model_dir")),
    "MODEL": T5xMacro(sets=("train.model",), note="set by a `gin/models/` file; eval and infer read the "
                                                   "model from the checkpoint"),
    "USE_CACHED_TASKS": T5xMacro(sets=("train/DataConfig.use_cached", "eval/DataConfig.use_cached"),
                                 note="default `False` (t5x: `True`); `t5x-lite cache` writes the cache"),
    "SHUFFLE_TRAIN_EXAMPLES": T5xMacro(sets=("train/DataConfig.shuffle",)),
    "RANDOM_SEED": T5xMacro(sets=("train.seed", "train/DataConfig.seed"),
                            note="or `SEED`; default `0`, a reproducible run (t5x's `None` draws a seed)"),
    "INITIAL_CHECKPOINT_PATH": T5xMacro(sets=("InitFrom.checkpoint",),
                                        note="`finetune.gin`: a model directory (its latest step) or "
                                             "`MODEL_DIR/checkpoints/<step>`"),
    "DROPOUT_RATE": T5xMacro(sets=("MODEL/DecoderConfig.dropout_rate", "MODEL/T5Config.dropout_rate"),
                             note="default `0.0` when nothing sets it (t5x's `finetune.gin`: `0.1`); set it before or "
                                  "after the model file"),
    "EVAL_PERIOD": T5xMacro(sets=("train.eval_period",), note="also in epochs, `'1 epoch'`; default `0`: "
                                                               "evaluate at the end only"),
    "EVAL_STEPS": T5xMacro(sets=("train.eval_batches",), note="default `None`: the whole split"),
    # t5x/examples/t5/t5_1_1/*.gin (model files; this project's model files leave the loss to the run)
    "Z_LOSS": T5xMacro(sets=("LossConfig.z_loss",), note="default `1e-4`, as in t5x"),
    "LABEL_SMOOTHING": T5xMacro(sets=("LossConfig.label_smoothing",), note="default `0.0`, as in t5x"),
    # t5x/configs/runs/eval.gin and infer.gin
    "CHECKPOINT_PATH": T5xMacro(sets=("evaluate.model_dir", "infer.model_dir"),
                                note="or `MODEL_DIR`; a step directory, or a model directory (its latest step)"),
    "EVAL_OUTPUT_DIR": T5xMacro(sets=("evaluate.output_dir",), note="default `MODEL_DIR/eval`"),
    "INFER_OUTPUT_DIR": T5xMacro(sets=("infer.output_dir",), note="writes `INFER_OUTPUT_DIR/<task>.jsonl`"),
    # Refused: no equivalent here.
    "USE_HARDWARE_RNG": T5xMacro(same_here=(False,), instead="--gin.RANDOM_SEED=N",
                                 why="this project's random numbers come from JAX's default generator and the "
                                     "data seed, both set by RANDOM_SEED"),
    "TRAIN_STEPS_RELATIVE": T5xMacro(same_here=(None,), instead="--gin.TRAIN_STEPS=N",
                                     why="with finetune.gin TRAIN_STEPS already counts the fine-tuning steps "
                                         "alone; a resumed run trains up to TRAIN_STEPS"),
    "LOSS_NORMALIZING_FACTOR": T5xMacro(why="the loss here is always the mean over the batch's target tokens "
                                            "(t5x's None sums them)"),
    "EVALUATOR_NUM_EXAMPLES": T5xMacro(instead="--gin.SeqioEval.num_examples=N",
                                       why="training runs no seqio inference evaluation; t5x-lite eval does"),
    "EVALUATOR_USE_MEMORY_CACHE": T5xMacro(why="training runs no seqio inference evaluation"),
    "JSON_WRITE_N_RESULTS": T5xMacro(instead="--gin.SeqioEval.num_examples=N",
                                     why="training runs no seqio inference evaluation, and t5x-lite eval "
                                         "writes every prediction it makes"),
    "USE_CACHED_TASKS_TRAIN_EVAL": T5xMacro(instead="--gin.eval/DataConfig.use_cached=True",
                                            why="the evaluation data of a training run is eval/DataConfig"),
    "TRAIN_EVAL_MIXTURE_OR_TASK_NAME": T5xMacro(instead="--gin.eval/DataConfig.mixture_or_task_name=NAME",
                                                why="the evaluation data of a training run is eval/DataConfig"),
    "NUM_MODEL_PARTITIONS": T5xMacro(instead="--gin_file=mesh/fsdp_tensor.gin",
                                     why="the mesh comes from a gin/mesh file (or MESH_AXES)"),
    "MODEL_PARALLEL_SUBMESH": T5xMacro(instead="--gin_file=mesh/fsdp_tensor.gin",
                                       why="the mesh comes from a gin/mesh file (or MESH_AXES)"),
    "OPTIMIZER": T5xMacro(instead="--gin_file=optimizers/adafactor_t5.gin",
                          why="the optimizer is train.optimizer (@AdamW(), @Adafactor(), ...)"),
    "VOCABULARY": T5xMacro(why="the vocabulary is the task's (its output features', or its prepared "
                               "directory's spm.model)"),
}


def refusal(name: str, binding: Binding) -> str:
    """The line that refuses `binding`, a setting of refused macro `name`."""
    macro = T5X_MACROS[name]
    fix = f"use {macro.instead} instead" if macro.instead else "drop it"
    return f"{binding.key} ({binding.source}) is t5x's, and has no equivalent here: {macro.why}; {fix}."


def check_refused(bindings: Sequence[Binding], macros_used: Callable[[object], list[str]]) -> None:
    """A ConfigError, one line per macro, when the run sets a refused t5x macro that no binding reads
    (a macro the user's own bindings read is theirs, whatever its name) to a value not `same_here`."""
    effective = list({b.key: b for b in bindings}.values())
    read = {name for b in effective for name in macros_used(b.value)}
    problems = [refusal(b.key, b) for b in effective
                if b.is_macro and b.key in T5X_MACROS and T5X_MACROS[b.key].refused and b.key not in read
                and not _same_here(T5X_MACROS[b.key], b.value)]
    if problems:
        raise ConfigError("\n".join(problems))


def _same_here(macro: T5xMacro, value: Any) -> bool:
    return any(value is v or (type(value) is type(v) and value == v) for v in macro.same_here)


def accepted_unused(binding: Binding) -> bool:
    """A refused macro set to what this project always does: nothing to bind, nothing to warn about."""
    macro = T5X_MACROS.get(binding.key) if binding.is_macro else None
    return macro is not None and macro.refused and _same_here(macro, binding.value)


def unused_hint(name: str, entry: str) -> str | None:
    """What table macro `name` sets, said of a run (entry point `entry`) that reads it not; None otherwise."""
    macro = T5X_MACROS.get(name)
    if macro is None or macro.refused:
        return None
    return (f"t5x's {name} sets {', '.join(macro.sets)} in the runs that read it; this {entry} run does "
            "not (it has no such parameter, or a binding sets it directly).")


def doc_rows() -> list[str]:
    """The rows of docs/from_t5x.md's table of t5x macros: macro | here | notes."""
    rows = []
    for name, macro in T5X_MACROS.items():
        if macro.refused:
            here = f"refused: use `{macro.instead}`" if macro.instead else "refused: drop it"
            accepted = " or ".join(f"`{v!r}`" for v in macro.same_here)
            note = macro.why + (f"; {accepted}, what is done here anyway, is accepted" if accepted else "")
        else:
            here, note = ", ".join(f"`{label}`" for label in macro.sets), macro.note
        rows.append(f"| `{name}` | {here} | {note} |")
    return rows
