"""Starting a run from another run's parameters (fine-tuning), with an explicit name mapping.

Only parameters are taken: the optimizer state starts afresh, so the new run may use another
optimizer or schedule. A source with Hugging Face files (hf/ of a from-hf conversion: its
tokenizer and config.json) gives the new run a copy of them (`copy_hf_files`). Parameter paths are '/'-joined names such as
`decoder/layers/attention/query/kernel`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from t5x_lite import storage
from t5x_lite.checkpoints import checkpoint, lookup
from t5x_lite.data.vocab.tokenizer_files import HF_SUBDIR
from t5x_lite.errors import ConfigValueError, UserError


class InitFromError(UserError, ValueError):
    """The checkpoint to start from cannot be found or does not fit the model."""


@dataclasses.dataclass(frozen=True)
class InitFrom:
    """The checkpoint whose parameters a new run starts from.

    Attributes:
      checkpoint: a model directory (local, gs:// or s3://) or one of its step directories
        (MODEL_DIR/checkpoints/<step>).
      step: which step of a model directory (None: its latest).
      mapping: (target regex, source template) rules; the first whose regex matches a target
        parameter's whole path gives the source path (re.sub syntax, `\\1` for groups), or
        None to keep the target's fresh initialisation. Paths no rule matches map to themselves.
      strict: every target parameter must come from the source (or be named by a None rule)
        with the same shape; False keeps the fresh initialisation of the others, with a warning.
    """

    checkpoint: str
    step: int | None = None
    mapping: Sequence[tuple[str, str | None]] = ()
    strict: bool = True

    def __post_init__(self):
        if not self.checkpoint:
            raise ConfigValueError("InitFrom.checkpoint is not set: name the checkpoint to start from, e.g. "
                                   "--gin.INITIAL_CHECKPOINT_PATH=\"'runs/pretrained'\" (runs/finetune.gin).")
        for rule in self.mapping:
            if len(rule) != 2:
                raise ConfigValueError(f"InitFrom.mapping rule {rule!r} must be a (target regex, source template) pair.")
            try:
                re.compile(rule[0])
            except re.error as e:
                raise ConfigValueError(f"InitFrom.mapping regex {rule[0]!r} is not valid: {e}") from None


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': x}} -> {'a/b': x}."""
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{path}/"))
        else:
            flat[path] = value
    return flat


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path, value in flat.items():
        node = tree
        *parents, leaf = path.split("/")
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return tree


def plan_mapping(target_shapes: Mapping[str, tuple[int, ...]], source_shapes: Mapping[str, tuple[int, ...]],
                 mapping: Sequence[tuple[str, str | None]], *, strict: bool) -> tuple[dict[str, str | None], list[str]]:
    """Which source path fills each target path (None: keep the initialisation), and the warnings.

    Raises InitFromError naming every problem when `strict` (or for a shape mismatch, always).
    """
    plan: dict[str, str | None] = {}
    missing, shape_errors = [], []
    for target, shape in target_shapes.items():
        source: str | None = target
        for pattern, template in mapping:
            if re.fullmatch(pattern, target):
                source = None if template is None else re.sub(f"^(?:{pattern})$", template, target)
                break
        if source is None:
            plan[target] = None
        elif source not in source_shapes:
            missing.append(f"{target} (looked for {source})")
            plan[target] = None
        elif tuple(source_shapes[source]) != tuple(shape):
            shape_errors.append(f"{target}: shape {tuple(shape)} but the source's {source} is {tuple(source_shapes[source])}")
        else:
            plan[target] = source
    if shape_errors or (missing and strict):
        problems = shape_errors + [f"not in the source: {m}" for m in missing]
        raise InitFromError(
            "The checkpoint to start from does not fit the model:\n  " + "\n  ".join(problems[:20])
            + ("\n  ..." if len(problems) > 20 else "")
            + "\nAdd train.init_from mapping rules (target regex -> source path, or None to keep the "
            "fresh initialisation), or set InitFrom.strict=False to initialise what is missing.")
    used = {s for s in plan.values() if s}
    warnings = [f"init_from: {m} is not in the source; it keeps its fresh initialisation" for m in missing]
    unused = sorted(set(source_shapes) - used)
    if unused:
        warnings.append(f"init_from: {len(unused)} source parameter(s) not used, e.g. {unused[:3]}")
    return plan, warnings


def resolve(init: InitFrom) -> tuple[str, int]:
    """(model directory, step) named by `init.checkpoint` and `init.step`."""

    try:
        return lookup.locate(init.checkpoint, init.step)
    except lookup.CheckpointNotFoundError as e:
        raise InitFromError(f"train.init_from: {e}") from None


def copy_hf_files(init: InitFrom, model_dir: str, *, log: Callable[[str], None]) -> list[str]:
    """The source's Hugging Face files (MODEL_DIR/hf/ of a from-hf conversion: its tokenizer, config.json,
    generation_config.json) copied into this run's `model_dir`/hf/, where `sample`, `eval`, `infer`
    and `to-hf` find them (restored_model.py, hf/convert.py); the names copied (none without hf/)."""

    source_dir, _ = resolve(init)
    source = storage.join(source_dir, HF_SUBDIR)
    if not storage.exists(source):
        return []
    target = storage.join(model_dir, HF_SUBDIR)
    storage.makedirs(target)
    names = [name.rstrip("/") for name in storage.listdir(source)]
    for name in names:
        storage.copy(storage.join(source, name), storage.join(target, name))
    log(f"init_from: copied {source} ({', '.join(names)}) to {target}: the tokenizer and config of the model "
        "this run starts from.")
    return names


def load_params(init: InitFrom, *, target_params: Any, warn: Callable[[str], None]) -> Any:
    """`target_params` (a sharded tree) with the values `init` names, in its dtypes and shardings."""

    model_dir, step = resolve(init)
    checkpointer = checkpoint.Checkpointer(model_dir, read_only=True)
    try:
        source = flatten(checkpointer.restore_params(step))
    finally:
        checkpointer.close()
    target = flatten(target_params)
    plan, warnings = plan_mapping({k: v.shape for k, v in target.items()}, {k: v.shape for k, v in source.items()},
                                  init.mapping, strict=init.strict)
    for line in warnings:
        warn(line)
    out = {}
    for path, value in target.items():
        src = plan[path]
        out[path] = value if src is None else jax.device_put(np.asarray(source[src], dtype=value.dtype), value.sharding)
    taken = sum(1 for s in plan.values() if s)
    warn(f"Initialised {taken} of {len(plan)} parameter arrays from {model_dir} step {step} "
         "(optimizer state starts afresh).")
    return unflatten(out)
