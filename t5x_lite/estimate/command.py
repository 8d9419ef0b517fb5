"""`t5x-lite estimate`: parameters, FLOPs, tokens, memory per device and time to train.

Reads the same gin flags as `t5x-lite train` and does the napkin math of a pre-training run
without training: nothing is allocated, the task's data is not read (only the `metadata.json`
that `t5x-lite prepare` writes), and only `--compile` compiles the real train step.

    t5x-lite estimate --gin_file=runs/quickstart.gin --accelerator=h100-sxm --num_devices=8

This module is the command: its flags, `estimate` (every number of the result) and `main`.
The run comes from run_from_gin.py, the epoch from epoch.py, the mesh from layout.py, memory
from memory.py and the text from report.py; the formulas are in arithmetic.py and written out
in docs/estimate.md. JAX's backends start only when a device is asked for, so `main` can ask for
`--num_devices` host CPU devices for `--compile` first.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, Mapping, Sequence

import jax

from t5x_lite import errors, host_memory
from t5x_lite.config import parsing
from t5x_lite.config import resolve as config_resolve
from t5x_lite.errors import ConfigValueError
from t5x_lite.estimate import accelerators
from t5x_lite.estimate import arithmetic as estimate_math
from t5x_lite.estimate.epoch import epoch_estimate
from t5x_lite.estimate.layout import check_layout
from t5x_lite.estimate.memory import compiled_memory, ensure_devices, memory_estimate, request_cpu_devices
from t5x_lite.estimate.report import format_report
from t5x_lite.estimate.run_from_gin import RunSettings, run_settings

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


# ------------------------------------------------------------------------------ estimate


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
    return jax.default_backend()


def parameter_counts(model: Any) -> dict[str, int]:
    """Total, embedding and non-embedding parameters, from the model config's arithmetic."""
    total, embedding = model.num_params(), model.num_embedding_params()
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding}


def estimate(settings: RunSettings, flags: Flags) -> dict[str, Any]:
    """Every number of the report, as a JSON-able dict (see docs/estimate.md for each formula)."""

    model, data = settings.model, settings.train_data
    num_devices = jax.device_count() if flags.num_devices is None else flags.num_devices
    mesh_shape, batch_shards = check_layout(settings, num_devices=num_devices)
    if flags.compile:
        ensure_devices(num_devices)  # before the arithmetic: a missing device is the first thing to say

    lengths = dict(targets_length=data.sequence_length, inputs_length=data.inputs_length)
    flops_token = model.train_flops_per_token(**lengths)
    # The split reads how the attention term grows with the lengths, which a sliding window caps:
    # it is taken without the window (same 6N), and the attention part is what the window leaves.
    full = dataclasses.replace(model, sliding_window=None) if getattr(model, "sliding_window", None) else model
    doubled = full.train_flops_per_token(targets_length=2 * data.sequence_length,
                                         inputs_length=data.inputs_length and 2 * data.inputs_length)
    six_n, _ = estimate_math.flops_split(flops_per_token=full.train_flops_per_token(**lengths),
                                         flops_per_token_doubled_lengths=doubled)
    attention = flops_token - six_n
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


# ---------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """`t5x-lite estimate`: bad input is one `error: ...` line and exit code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    with errors.reported():
        files, bindings, paths, rest = parsing.split_gin_flags(argv)
        flags = parse_flags(rest)
        if flags.compile and flags.num_devices:
            request_cpu_devices(flags.num_devices)  # before anything starts JAX's backends
        # MODEL_DIR or the task may be left unset: the estimate needs neither.
        resolved = config_resolve.load_run(gin_files=files, gin_bindings=bindings, gin_search_paths=paths,
                                           entry="train", check_macros=False)
        chip = accelerators.get(flags.accelerator) if flags.accelerator else None
        settings = run_settings(resolved, device_bytes=int(chip.memory_gb * 1e9) if chip else None)
        result = estimate(settings, flags)
        print(json.dumps(result, indent=2) if flags.json else format_report(result), end="" if not flags.json else "\n")
    return 0


if __name__ == "__main__":
    host_memory.run_program(main)
