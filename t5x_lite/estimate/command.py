"""`t5x-lite estimate`: parameters, FLOPs, tokens, memory per device and time to train.

Reads the same gin flags as `t5x-lite train` and does the napkin math of a pre-training run
without training: nothing is allocated, the task's data is not read (only the `metadata.json`
that `t5x-lite prepare` writes), and only `--compile` compiles the real train step.

    t5x-lite estimate --gin_file=runs/quickstart.gin --accelerator=h100-sxm --num_devices=8

The arithmetic functions below take explicit keyword arguments and are tested directly; the
formulas are written out in docs/estimate.md. JAX is imported inside functions only, so that
`--compile --num_devices=N` can ask for N host CPU devices before JAX starts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from typing import Any, Mapping, Sequence

from t5x_lite import errors, storage
from t5x_lite.config import parsing as config
from t5x_lite.config import resolve as config_resolve
from t5x_lite.config.resolve import REQUIRED, DeferredCall
from t5x_lite.data import prepared_dataset
from t5x_lite.errors import ConfigValueError
from t5x_lite.estimate import accelerators
from t5x_lite.estimate import arithmetic as estimate_math
from t5x_lite.models import stack, train_flops_per_token
from t5x_lite.parallel import partitioning
from t5x_lite.training import run_spec
from t5x_lite.training import trainer as trainer_lib

USAGE = """usage: t5x-lite estimate --gin_file=FILE [--gin_file=...] [--gin.KEY=VALUE ...] [flags]

Parameters, training FLOPs, tokens per epoch, memory per device and time to train of the run
that `t5x-lite train` would start with the same gin flags. Nothing is trained or allocated.

flags:
  --num_devices=N      devices of the mesh (resolves the -1 axis of MESH_AXES; default: JAX's device count)
  --accelerator=NAME   for the time estimate: one of """ + ", ".join(accelerators.ACCELERATORS) + """
  --peak_flops=F       dense peak FLOP/s of one device (instead of, or overriding, --accelerator)
  --mfu=F              model FLOPs utilisation assumed for the time estimate, in (0, 1] (default 0.4)
  --tokens=N           tokens to train on (suffixes K, M, B, T; default: the run's steps x tokens per step)
  --compile            also lower and compile the real train step on the mesh and report XLA's memory
                       analysis per device (on CPU, --num_devices host devices are created for it)
  --json               print one JSON object instead of the report
"""

GIB = 2**30
MIB = 2**20
# Task factories whose data directory was written by `t5x-lite prepare` (metadata.json).
PREPARED_TASK_FACTORIES = ("lm_task", "span_corruption_task", "prefix_lm_task")
TASK_FACTORIES = (*PREPARED_TASK_FACTORIES, "text_task", "text_to_text_task", "mixture")


# --------------------------------------------------------------------------------- flags


@dataclasses.dataclass(frozen=True)
class Flags:
    """The estimate's own flags (the gin flags are parsed by t5x_lite.config)."""

    tokens: int | None = None
    mfu: float = 0.4
    accelerator: str | None = None
    peak_flops: float | None = None
    num_devices: int | None = None
    json: bool = False
    compile: bool = False


_VALUE_FLAGS = ("tokens", "mfu", "accelerator", "peak_flops", "num_devices")
_BOOL_FLAGS = ("json", "compile")
_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_count(text: str, *, flag: str) -> float:
    """'3e11', '300B', '1.5T', '2048' -> a float; anything else is a ConfigValueError naming `flag`."""
    value = text.strip().replace("_", "").replace(",", "")
    scale = _SUFFIXES.get(value[-1:].upper(), 1.0) if value and value[-1].isalpha() else 1.0
    if scale != 1.0:
        value = value[:-1]
    try:
        return float(value) * scale
    except ValueError:
        raise ConfigValueError(f"--{flag}={text!r} is not a number (suffixes K, M, B, T are allowed).") from None


def parse_flags(args: Sequence[str]) -> Flags:
    """The estimate's flags from what is left of argv after the gin flags; checks their ranges."""
    values: dict[str, Any] = {}
    args = list(args)
    while args:
        arg = args.pop(0)
        key, eq, value = arg.partition("=")
        name = key[2:] if key.startswith("--") else None
        if name in _BOOL_FLAGS:
            values[name] = not eq or value.lower() in ("1", "true", "yes")
            continue
        if name not in _VALUE_FLAGS:
            raise ConfigValueError(f"Unknown argument {arg!r}; estimate takes --gin_file, --gin.KEY=VALUE, "
                                   f"--gin_search_paths and --{', --'.join(_VALUE_FLAGS + _BOOL_FLAGS)} (see --help).")
        if not eq:
            if not args:
                raise ConfigValueError(f"--{name} needs a value.")
            value = args.pop(0)
        values[name] = value
    flags = Flags(
        tokens=_positive_int(values, "tokens"), num_devices=_positive_int(values, "num_devices"),
        mfu=parse_count(values["mfu"], flag="mfu") if "mfu" in values else Flags.mfu,
        peak_flops=parse_count(values["peak_flops"], flag="peak_flops") if "peak_flops" in values else None,
        accelerator=values.get("accelerator"), json=values.get("json", False), compile=values.get("compile", False))
    if not 0.0 < flags.mfu <= 1.0:
        raise ConfigValueError(f"--mfu={flags.mfu:g} must be in (0, 1]: the fraction of peak FLOP/s the model "
                               "achieves (0.3 to 0.5 is typical of a well-tuned large run).")
    if flags.peak_flops is not None and flags.peak_flops <= 0:
        raise ConfigValueError(f"--peak_flops={flags.peak_flops:g} must be positive (FLOP/s of one device).")
    if flags.accelerator is not None:
        accelerators.get(flags.accelerator)  # an unknown name fails here, before any work
    return flags


def _positive_int(values: Mapping[str, str], name: str) -> int | None:
    if name not in values:
        return None
    number = parse_count(values[name], flag=name)
    if number < 1 or number != int(number):
        raise ConfigValueError(f"--{name}={values[name]} must be a positive whole number.")
    return int(number)


# ---------------------------------------------------------------------- the run from gin


@dataclasses.dataclass(frozen=True)
class TaskSource:
    """What the gin config says about the train task, read without registering it."""

    name: str | None
    factory: str | None  # the task factory's gin name (lm_task, ...); None for a plain task name
    data_dir: str | None  # a `t5x-lite prepare` directory, when the factory reads one


@dataclasses.dataclass(frozen=True)
class RunSettings(run_spec.RunSpec):
    """The run as `train` would start it, and where its task's data is (read without registering it)."""

    task: TaskSource = TaskSource(name=None, factory=None, data_dir=None)


def _task_source(value: Any) -> TaskSource:
    """Where the train task's data is, from the task factory call the config would make."""

    if isinstance(value, DeferredCall):
        data_dir = value.kwargs.get("data_dir") if value.name in PREPARED_TASK_FACTORIES else None
        return TaskSource(name=value.kwargs.get("name"), factory=value.name, data_dir=data_dir)
    if not isinstance(value, str):  # None, or a macro (MIXTURE_OR_TASK_NAME) the config leaves unset
        return TaskSource(name=None, factory=None, data_dir=None)
    return TaskSource(name=value, factory=None, data_dir=None)


def model_from_gin(resolved: Any, macro: str = "MODEL") -> Any:
    """The model config a gin macro (MODEL in gin/models/*.gin) builds."""

    model = resolved.build_macro(macro)
    if model is REQUIRED:
        raise ConfigValueError(f"The gin config binds no macro {macro}.")
    return model


def run_settings(resolved: Any) -> RunSettings:
    """The run that `t5x-lite train` would start with this resolved config (train is not called).

    Task factories are not called: registering a task imports TensorFlow and reads its data
    directory, and the estimate must work before the data exists. Their arguments say where
    the data is. Unbound parameters of `train` take their defaults from its signature.
    """

    _, params = resolved.calls[0]
    raw = {p.name: p.setting.binding.value if p.setting else p.value for p in params}
    for name in ("model", "train_data"):
        if raw[name] is REQUIRED:
            raise ConfigValueError(f"The gin files do not bind train.{name}; compose a run file such as "
                                   "--gin_file=runs/quickstart.gin (a model file alone describes no run).")
    values = {name: resolved.build(value, defer=TASK_FACTORIES) for name, value in raw.items()}
    train_data = values["train_data"]
    task = _task_source(train_data.mixture_or_task_name)
    train_data = dataclasses.replace(train_data, mixture_or_task_name=task.name or "(unnamed task)")
    spec_fields = {f.name for f in dataclasses.fields(run_spec.RunSpec)}
    return RunSettings(**{name: values[name] for name in spec_fields if name != "train_data"},
                       train_data=train_data, task=task)


# --------------------------------------------------------------------------------- data


def epoch_estimate(*, task: TaskSource, train_data: Any) -> dict[str, Any]:
    """Tokens and steps per epoch from the task's prepared metadata, or None with the reason why not."""
    unknown = {"tokens_per_epoch": None, "steps_per_epoch": None, "documents": None}
    if task.data_dir is None:
        why = ("the config names no task (MIXTURE_OR_TASK_NAME)" if task.name is None and task.factory is None
               else f"the task {task.name!r} is not a prepared directory read by lm_task" if task.factory is None
               else f"{task.factory} does not read a `t5x-lite prepare` directory")
        return {**unknown, "note": f"unknown: {why}; `t5x-lite train` counts the steps of each epoch as it starts"}

    try:
        metadata = prepared_dataset.read_metadata(task.data_dir)
    except (OSError, ValueError, storage.StorageError) as e:  # unreadable: the estimate goes on without it
        return {**unknown, "note": f"unknown: cannot read metadata.json of {task.data_dir!r} ({e})"}
    if metadata is None:
        return {**unknown, "note": f"unknown: {task.data_dir!r} has no metadata.json (not prepared yet? "
                                   "run `t5x-lite prepare --input=... --out=DIR`)"}
    split = metadata.get("splits", {}).get(train_data.split)
    if not split or "num_tokens" not in split:
        return {**unknown, "note": f"unknown: metadata.json of {task.data_dir!r} has no {train_data.split!r} split"}
    documents, corpus_tokens = int(split["num_examples"]), int(split["num_tokens"])
    if task.factory != "lm_task" or train_data.converter != "lm":
        return {**unknown, "documents": documents, "corpus_tokens": corpus_tokens,
                "note": f"{corpus_tokens:,} corpus tokens; rows per epoch unknown: {task.factory} rewrites the "
                        "documents into rows (counted when `t5x-lite train` starts)"}
    pieces = estimate_math.lm_pieces(corpus_tokens=corpus_tokens, documents=documents, sequence_length=train_data.sequence_length)
    tokens = corpus_tokens + pieces  # lm_task appends one EOS to each piece
    steps = estimate_math.steps_per_epoch(tokens_per_epoch=tokens, batch_size=train_data.batch_size,
                            sequence_length=train_data.sequence_length)
    return {"tokens_per_epoch": tokens, "steps_per_epoch": steps, "documents": documents,
            "corpus_tokens": corpus_tokens,
            "note": f"{corpus_tokens:,} tokens (metadata.json) + an EOS for each of >= {pieces:,} document pieces"}


# ------------------------------------------------------------------------------ memory


def example_batch(train_data: Any, rows: int) -> dict[str, Any]:
    """Zero int32 arrays with the features (and packing features) the train step receives."""
    import numpy as np

    shapes = dict(train_data.model_feature_shapes(rows))
    targets = shapes["decoder_input_tokens"]
    shapes.update(decoder_target_tokens=targets, decoder_loss_weights=targets)
    if train_data.pack:
        prefixes = ["decoder"] + (["encoder"] if "encoder_input_tokens" in shapes else [])
        for prefix in prefixes:
            length = shapes[f"{prefix}_input_tokens"]
            shapes.update({f"{prefix}_segment_ids": length, f"{prefix}_positions": length})
    return {name: np.zeros(shape, np.int32) for name, shape in shapes.items()}


def _trainer(settings: RunSettings, mesh: Any) -> Any:

    total_steps = max(settings.train_steps or 1, 1)  # the schedule's length changes no shape
    return trainer_lib.Trainer.for_run(model=settings.model, optimizer=settings.optimizer, total_steps=total_steps,
                                       mesh=mesh, rules=settings.logical_axis_rules, loss=settings.loss,
                                       microbatches=settings.microbatches)


def state_bytes_per_device(settings: RunSettings, mesh_shape: Mapping[str, int]) -> dict[str, int]:
    """Bytes per device of parameters, optimizer state and step of the train state, by arithmetic.

    The state's shapes and logical partitioning come from `Trainer.abstract_state` (the same code
    the train loop uses, under jax.eval_shape: nothing is allocated) on a one-device mesh with
    the run's axis names; each array's mesh PartitionSpec is then applied to `mesh_shape`.
    Also returns the parameter tree's element count, as a check of `num_params()`.
    """
    import jax


    mesh = partitioning.make_mesh(axes=[(name, 1) for name in mesh_shape], devices=jax.devices()[:1])
    state = _trainer(settings, mesh).abstract_state(example_batch(settings.train_data, rows=1))

    def total(tree) -> int:
        return sum(estimate_math.per_device_elements(shape=leaf.shape, shards=estimate_math.spec_shards(leaf.sharding.spec, mesh_shape))
                   * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))

    return {"params": total(state.params), "optimizer_state": total(state.opt_state), "step": total(state.step),
            "tree_params": sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state.params))}


def _logical_shards(logical: tuple[str, ...], rules: Any, mesh_shape: Mapping[str, int]) -> tuple[int, ...]:

    return estimate_math.spec_shards(partitioning.logical_to_mesh_spec(logical, rules), mesh_shape)


def _filtered_rules(rules: Any, mesh_shape: Mapping[str, int]) -> Any:
    from types import SimpleNamespace


    return partitioning.rules_for_mesh(rules, SimpleNamespace(axis_names=tuple(mesh_shape)))


def uses_fused_attention(model: Any, *, platform: str) -> bool:
    """Whether the model's attention runs as cuDNN's fused (flash) kernel on `platform`, which keeps
    no [length x length] scores; mirrors layers.attention_implementation ('auto': GPU, 16-bit, head_dim
    a multiple of 8 up to 128). The T5 model always uses XLA's attention."""
    choice = getattr(model, "attention_implementation", "xla")
    if choice != "auto":
        return choice == "cudnn"
    return (platform == "gpu" and model.dtype in ("bfloat16", "float16") and model.head_dim % 8 == 0
            and model.head_dim <= 128)


def activations_estimate(settings: RunSettings, mesh_shape: Mapping[str, int], *,
                         fused_attention: bool = False) -> dict[str, Any]:
    """Rough activation and logits bytes per device for the model, batch, mesh and remat policy.

    With `fused_attention` no attention scores are kept (a flash kernel recomputes them).
    """
    import jax.numpy as jnp

    model, data = settings.model, settings.train_data
    rules = _filtered_rules(settings.logical_axis_rules, mesh_shape)
    batch_shards, _, heads_shards, _ = _logical_shards(("batch", "length", "heads", "kv"), rules, mesh_shape)
    mlp_shards = _logical_shards(("batch", "length", "mlp"), rules, mesh_shape)[2]
    vocab_shards = _logical_shards(("batch", "length", "vocab"), rules, mesh_shape)[2]
    rows = data.batch_size // batch_shards // settings.microbatches
    common = dict(policy=model.remat_policy, dtype_bytes=jnp.dtype(model.dtype).itemsize, width=model.emb_dim,
                  mlp=model.mlp_dim / mlp_shards, n_mlp_in=len(model.mlp_activations))
    q = model.num_heads * model.head_dim / heads_shards
    heads = 0 if fused_attention else model.num_heads / heads_shards  # rows of scores kept per token
    length = data.sequence_length
    if model.family == "encoder_decoder":
        inputs = data.inputs_length or length
        enc = estimate_math.activation_bytes(num_layers=model.num_encoder_layers, tokens=rows * inputs, q=q, kv=2 * q,
                               scores=heads * inputs, **common)
        # Decoder layers: self- and cross-attention, each counted like one attention block.
        dec = estimate_math.activation_bytes(num_layers=model.num_decoder_layers, tokens=rows * length, q=2 * q, kv=4 * q,
                               scores=heads * (length + inputs), **common)
        device, host = enc[0] + dec[0], enc[1] + dec[1]
    else:
        kv = 2 * model.num_kv_heads * model.head_dim / heads_shards
        device, host = estimate_math.activation_bytes(num_layers=model.num_layers, tokens=rows * length, q=q, kv=kv,
                                        scores=heads * length, **common)
    logits = estimate_math.logits_bytes(tokens=rows * length, vocab_size=model.vocab_size, vocab_shards=vocab_shards)
    return {"rows_per_device": rows, "remat_policy": model.remat_policy, "dtype": model.dtype,
            "attention": "cuDNN flash attention" if fused_attention else "XLA attention (scores kept)",
            "activations": device, "activations_host": host, "logits": logits}


def _ensure_devices(num_devices: int) -> list[Any]:
    """The first `num_devices` JAX devices, or a clear error when JAX started with fewer."""
    import jax

    devices = jax.devices()
    if len(devices) < num_devices:
        platform = devices[0].platform
        hint = ("JAX had already started; run the command in a fresh process" if platform == "cpu" else
                "compile on host CPU devices instead with JAX_PLATFORMS=cpu")
        raise ConfigValueError(f"--compile on --num_devices={num_devices} needs {num_devices} devices, but JAX has "
                               f"{len(devices)} {platform} device(s); {hint}, or lower --num_devices.")
    return devices[:num_devices]


def request_cpu_devices(num_devices: int) -> None:
    """Asks JAX for `num_devices` host CPU devices (what XLA_FLAGS=--xla_force_host_platform_device_count=N
    does); a no-op once JAX's backends have started (then `_ensure_devices` checks the count)."""
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", num_devices)
    except RuntimeError:  # backends already initialised
        pass


def compiled_memory(settings: RunSettings, *, num_devices: int) -> dict[str, Any]:
    """XLA's memory analysis per device of the real train step, lowered and compiled on the mesh.

    Nothing runs and nothing is allocated: the state and batch are abstract. `total` is
    arguments + outputs - aliased (the donated state) + temp, the usual estimate of the peak.
    """
    import time


    devices = _ensure_devices(num_devices)
    stack.check_backend_supports(settings.model.remat_policy, devices[0])
    mesh = partitioning.make_mesh(axes=settings.mesh_axes, devices=devices)
    trainer = _trainer(settings, mesh)
    batch = example_batch(settings.train_data, rows=settings.train_data.batch_size)
    start = time.perf_counter()
    compiled = trainer.lower_train_step(batch).compile()
    seconds = time.perf_counter() - start
    batch_bytes = sum(v.nbytes for v in batch.values()) // partitioning.num_batch_shards(mesh, trainer.rules)
    return {**trainer_lib.compiled_memory_bytes(compiled.memory_analysis()), "batch": batch_bytes,
            "device": f"{num_devices} x {devices[0].device_kind}", "lower_and_compile_seconds": round(seconds, 2)}


# ------------------------------------------------------------------------------ estimate


def check_layout(settings: RunSettings, *, num_devices: int) -> tuple[dict[str, int], int]:
    """(mesh shape, batch shards) of the run on `num_devices`; a RunConfigError when the mesh, the
    batch and the sequence length do not fit together (`train` runs the same check before compiling)."""
    mesh_shape = estimate_math.resolve_mesh_shape(mesh_axes=settings.mesh_axes, num_devices=num_devices)
    rules = _filtered_rules(settings.logical_axis_rules, mesh_shape)
    batch_shards = _logical_shards(("batch",), rules, mesh_shape)[0]
    run_spec.check_layout(settings, batch_shards=batch_shards)
    return mesh_shape, batch_shards


def _time(settings: RunSettings, flags: Flags, *, flops_per_token: float, tokens_per_step: int,
          steps: int | None, num_devices: int) -> dict[str, Any]:
    model = settings.model
    out: dict[str, Any] = {"mfu": flags.mfu, "num_devices": num_devices, "accelerator": None, "precision": None,
                           "peak_flops_per_device": flags.peak_flops, "peak_from": "--peak_flops",
                           "tokens": flags.tokens, "seconds": None}
    if flags.tokens:
        out["tokens_from"] = "--tokens"
    elif steps:
        out["tokens"] = steps * tokens_per_step
        out["tokens_from"] = f"{steps:,} steps x {tokens_per_step:,} tokens per step"
    if flags.accelerator:
        chip = accelerators.get(flags.accelerator)
        peak, column = accelerators.peak_flops(chip, model.dtype)
        out.update(accelerator=chip.name, memory_gb=chip.memory_gb, precision=column, source=chip.source)
        if flags.peak_flops is None:
            out.update(peak_flops_per_device=peak, peak_from=f"{chip.name}, dense {column}")
    if out["peak_flops_per_device"] is None and settings.peak_flops_per_device:
        out.update(peak_flops_per_device=settings.peak_flops_per_device, peak_from="train.peak_flops_per_device")
    if out["tokens"] is None:
        out["note"] = "no step limit and no known epoch size; give --tokens=N"
    elif out["peak_flops_per_device"] is None:
        out["note"] = "give --accelerator=NAME or --peak_flops=F for the time"
    else:
        out["seconds"] = estimate_math.train_seconds(tokens=out["tokens"], flops_per_token=flops_per_token,
                                       peak_flops_per_device=out["peak_flops_per_device"],
                                       num_devices=num_devices, mfu=flags.mfu)
    return out


def _target_platform(flags: Flags) -> str:
    """'gpu' or 'tpu' for --accelerator, else the platform JAX runs on here."""
    if flags.accelerator:
        return accelerators.get(flags.accelerator).platform
    import jax

    return jax.default_backend()


def memory_estimate(settings: RunSettings, mesh_shape: Mapping[str, int], *, platform: str) -> dict[str, Any]:
    """Per-device bytes by arithmetic: the train state (exact), gradients, and rough activations and logits."""
    state = state_bytes_per_device(settings, mesh_shape)
    gradients = state["params"] * (1 if settings.microbatches == 1 else 2)  # + the accumulator
    train_state = state["params"] + state["optimizer_state"] + state["step"]
    fused = uses_fused_attention(settings.model, platform=platform)
    acts = activations_estimate(settings, mesh_shape, fused_attention=fused)
    return {"method": "arithmetic", **state, "gradients": gradients, "train_state": train_state,
            "state_total": train_state + gradients, **acts,
            "total": train_state + gradients + acts["activations"] + acts["logits"]}


def parameter_counts(model: Any) -> dict[str, int]:
    """Total, embedding and non-embedding parameters, from the model config's arithmetic."""
    total, embedding = model.num_params(), model.num_embedding_params()
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding}


def estimate(settings: RunSettings, flags: Flags) -> dict[str, Any]:
    """Every number of the report, as a JSON-able dict (see docs/estimate.md for each formula)."""

    model, data = settings.model, settings.train_data
    if flags.num_devices is None:
        import jax

        num_devices = jax.device_count()
    else:
        num_devices = flags.num_devices
    mesh_shape, batch_shards = check_layout(settings, num_devices=num_devices)
    if flags.compile:
        _ensure_devices(num_devices)  # before the arithmetic: a missing device is the first thing to say

    lengths = dict(targets_length=data.sequence_length, inputs_length=data.inputs_length)
    flops_token = train_flops_per_token(model, **lengths)
    doubled = train_flops_per_token(model, targets_length=2 * data.sequence_length,
                                    inputs_length=data.inputs_length and 2 * data.inputs_length)
    six_n, attention = estimate_math.flops_split(flops_per_token=flops_token, flops_per_token_doubled_lengths=doubled)
    tokens_per_step = data.batch_size * data.sequence_length
    epoch = epoch_estimate(task=settings.task, train_data=data)
    steps = estimate_math.planned_steps(train_steps=settings.train_steps, num_epochs=settings.num_epochs,
                          steps_per_epoch=epoch["steps_per_epoch"])

    return {
        "model": {"family": model.family, "config": type(model).__name__, "dtype": model.dtype,
                  "remat_policy": model.remat_policy},
        "mesh": {"shape": mesh_shape, "num_devices": num_devices, "batch_shards": batch_shards},
        "parameters": parameter_counts(model),
        "flops": {"per_token": flops_token, "per_token_6n": six_n, "per_token_attention": attention,
                  "tokens_per_step": tokens_per_step, "per_step": flops_token * tokens_per_step},
        "data": {"task": settings.task.name, "factory": settings.task.factory, "data_dir": settings.task.data_dir,
                 "split": data.split, "batch_size": data.batch_size, "sequence_length": data.sequence_length,
                 "inputs_length": data.inputs_length, "train_steps": settings.train_steps,
                 "num_epochs": settings.num_epochs, "planned_steps": steps, **epoch},
        "memory": memory_estimate(settings, mesh_shape, platform=_target_platform(flags)),
        "compiled": compiled_memory(settings, num_devices=num_devices) if flags.compile else None,
        "time": _time(settings, flags, flops_per_token=flops_token, tokens_per_step=tokens_per_step, steps=steps,
                      num_devices=num_devices),
    }


# ------------------------------------------------------------------------------ report


def _bytes(n: float) -> str:
    if n >= GIB:
        return f"{n / GIB:,.2f} GiB"
    if n >= MIB:
        return f"{n / MIB:,.1f} MiB"
    return f"{n / 1024:,.1f} KiB"


def _flops(x: float) -> str:
    for unit, scale in (("EFLOP", 1e18), ("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if x >= scale:
            return f"{x / scale:,.2f} {unit}"
    return f"{x:,.0f} FLOP"


def _duration(seconds: float) -> str:
    hours = seconds / 3600
    if hours >= 48:
        return f"{hours / 24:,.1f} days ({hours:,.0f} h)"
    if hours >= 1:
        return f"{hours:,.1f} h"
    return f"{seconds / 60:,.1f} min" if seconds >= 60 else f"{seconds:,.3g} s"


def _section(title: str, rows: Sequence[tuple[str, str, str]]) -> list[str]:
    width = max(len(label) for label, _, _ in rows)
    vwidth = max(len(value) for _, value, _ in rows)
    return [title] + [f"  {label:<{width}}  {value:>{vwidth}}" + (f"   {note}" if note else "")
                      for label, value, note in rows] + [""]


def _data_rows(d: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    lengths = f"batch {d['batch_size']} x sequence {d['sequence_length']}"
    if d["tokens_per_epoch"] is None:
        rows = [("tokens per epoch", "unknown", d["note"].removeprefix("unknown: ")),
                ("steps per epoch", "unknown", "")]
    else:
        rows = [("tokens per epoch", f"{d['tokens_per_epoch']:,}", d["note"]),
                ("steps per epoch", f"{d['steps_per_epoch']:,}",
                 f"tokens / ({lengths}) if packing filled every row: at least this")]
    limits = f"TRAIN_STEPS={d['train_steps']}, NUM_EPOCHS={d['num_epochs']}"
    return rows + [("planned steps", f"{d['planned_steps']:,}" if d["planned_steps"] else "unknown", limits)]


def _memory_rows(mem: Mapping[str, Any], sequence_length: int) -> list[tuple[str, str, str]]:
    offloaded = [("  offloaded to host", _bytes(mem["activations_host"]), "")] if mem["activations_host"] else []
    return [
        ("parameters", _bytes(mem["params"]), "float32, sharded by the logical-axis rules"),
        ("optimizer state", _bytes(mem["optimizer_state"]), "AdamW mu and nu, float32, sharded like the params"),
        ("gradients", _bytes(mem["gradients"]), "float32 (x2 with microbatches: the accumulator)"),
        ("state total", _bytes(mem["state_total"]), ""),
        ("activations (rough)", _bytes(mem["activations"]),
         f"remat {mem['remat_policy']!r}, {mem['rows_per_device']} rows x {sequence_length} tokens, "
         f"{mem['dtype']}, {mem['attention']}"),
        *offloaded,
        ("logits (rough)", _bytes(mem["logits"]), "float32 logits, softmax and gradient"),
        ("total (rough)", _bytes(mem["total"]), "")]


def _compiled_rows(c: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    return [("arguments", _bytes(c["arguments"]), f"train state + batch ({_bytes(c['batch'])})"),
            ("outputs", _bytes(c["outputs"]), "new state + metrics"),
            ("aliased", _bytes(c["aliased"]), "donated state reused for the outputs"),
            ("temp", _bytes(c["temp"]), "activations, gradients, scratch"),
            ("total", _bytes(c["total"]), "arguments + outputs - aliased + temp"),
            ("lower + compile", f"{c['lower_and_compile_seconds']:.1f} s", "")]


def _time_rows(t: Mapping[str, Any], memory_total: float) -> list[tuple[str, str, str]]:
    rows = [("tokens", f"{t['tokens']:,.0f}" if t["tokens"] else "unknown", t.get("tokens_from", ""))]
    if t["accelerator"]:
        rows.append(("accelerator", t["accelerator"], f"{t['precision']} peak; {t['source']}"))
    if t["peak_flops_per_device"]:
        rows.append(("peak per device", f"{t['peak_flops_per_device'] / 1e12:,.2f} TFLOP/s", t["peak_from"]))
    rows.append(("devices x MFU", f"{t['num_devices']} x {t['mfu']:g}", ""))
    if t["seconds"] is None:
        rows.append(("time to train", "unknown", t.get("note", "")))
    else:
        rows.append(("time to train", _duration(t["seconds"]), "tokens x FLOPs per token / (MFU x peak x devices)"))
    if t["accelerator"]:
        rows.append(("memory fits?", f"{memory_total / 1e9:,.1f} of {t['memory_gb']:g} GB",
                     "arithmetic total (rough) vs the chip's nominal memory"))
    return rows


def format_report(result: Mapping[str, Any]) -> str:
    """The aligned, human-readable report of an `estimate` result."""
    m, mesh, p, f, d, mem = (result[k] for k in ("model", "mesh", "parameters", "flops", "data", "memory"))
    devices = f"{mesh['num_devices']} device{'s' if mesh['num_devices'] > 1 else ''}"
    lines = [f"{m['config']} ({m['family']}, {m['dtype']}, remat {m['remat_policy']!r}) on mesh "
             + " x ".join(f"{k}={v}" for k, v in mesh["shape"].items()) + f" ({devices})", ""]
    lines += _section("Parameters", [
        ("total", f"{p['total']:,}", ""),
        ("embedding", f"{p['embedding']:,}", "lookup tables (tokens, learned positions)"),
        ("non-embedding", f"{p['non_embedding']:,}", "")])
    lines += _section("FLOPs (training)", [
        ("per token", _flops(f["per_token"]), "6N + attention, per target token (what MFU counts)"),
        ("  6N part", _flops(f["per_token_6n"]), "6 x matmul parameters"),
        ("  attention part", _flops(f["per_token_attention"]), "12 x heads x head_dim x attended positions, per layer"),
        ("tokens per step", f"{f['tokens_per_step']:,}", f"batch {d['batch_size']} x sequence {d['sequence_length']}"),
        ("per step", _flops(f["per_step"]), "")])
    task = repr(d["task"]) if d["task"] else "no task named"
    lines += _section(f"Data ({task}, split {d['split']!r})", _data_rows(d))
    lines += _section("Memory per device (arithmetic)", _memory_rows(mem, d["sequence_length"]))
    if result["compiled"]:
        lines += _section(f"Memory per device (--compile: XLA memory_analysis, {result['compiled']['device']})",
                          _compiled_rows(result["compiled"]))
    lines += _section("Time to train", _time_rows(result["time"], mem["total"]))
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """`t5x-lite estimate`: bad input is one `error: ...` line and exit code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    with errors.reported():

        files, bindings, paths, rest = config.split_gin_flags(argv)
        flags = parse_flags(rest)
        if flags.compile and flags.num_devices:
            request_cpu_devices(flags.num_devices)  # before anything starts JAX's backends
        # MODEL_DIR or the task may be left unset: the estimate needs neither.
        resolved = config_resolve.load_run(gin_files=files, gin_bindings=bindings, gin_search_paths=paths,
                                           entry="train", check_macros=False)
        result = estimate(run_settings(resolved), flags)
        print(json.dumps(result, indent=2) if flags.json else format_report(result), end="" if not flags.json else "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
