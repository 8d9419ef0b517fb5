"""What every benchmark shares: the header line, settings, timing, tables, and t5x_lite set-up.

Benchmarks build models from the library's own configs and train through its own `Trainer`
(`Trainer.train_step`, and `Trainer.lower_train_step` for compile time and memory), so the
figures measure t5x_lite, not a hand-written model.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

# No persistent compilation cache: compile times must be real compiles on every run.
jax.config.update("jax_enable_compilation_cache", False)

GIB = 1024**3
MIB = 1024**2


# ---------------------------------------------------------------------------- header


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":")[0].strip() in ("model name", "Model", "cpu model"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), else all of them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cores() -> str:
    return f"{usable_cores()} usable of {os.cpu_count()}"


def accelerator() -> str:
    devices = jax.devices()
    return f"{len(devices)} x {devices[0].device_kind} ({devices[0].platform})"


def git_revision() -> str:
    try:
        def run(*args):
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()

        dirty = "+uncommitted changes" if run("status", "--porcelain", "--untracked-files=no") else ""
        return run("rev-parse", "--short", "HEAD") + dirty
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def python_command(argv: Sequence[str]) -> str:
    """The command line that reproduces this run (from the repository root)."""
    exe = sys.executable
    rel = os.path.relpath(exe)
    exe = rel if not rel.startswith("..") else exe
    return shlex.join([exe, "-m", "bench", *argv])


def header(command: str) -> str:
    """One line: date, CPU, cores, accelerator, versions, revision, environment, command."""
    import flax

    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items())
                   if k.startswith(("XLA_", "JAX_", "TF_CPP", "CUDA_VISIBLE", "T5X_LITE_MALLOC", "GLIBC_TUNABLES")))
    parts = [
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        f"CPU: {cpu_model()}",
        f"cores: {cores()}",
        f"accelerator: {accelerator()}",
        f"jax {jax.__version__}, jaxlib {metadata.version('jaxlib')}, flax {flax.__version__}",
        f"python {platform.python_version()}",
        f"t5x_lite {git_revision()}",
        f"env: {env or '(no XLA_/JAX_ variables)'}",
        f"command: `{command}`",
    ]
    return "**" + " | ".join(parts) + "**"


# ---------------------------------------------------------------------------- settings


def resolve(args: Any, defaults: Mapping[str, Any], quick: Mapping[str, Any]) -> dict[str, Any]:
    """Each setting from the command line, else the --quick value, else the default."""
    out = {}
    for key, value in defaults.items():
        given = getattr(args, key, None)
        out[key] = given if given is not None else (quick[key] if args.quick and key in quick else value)
    return out


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def strs(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def settings_line(settings: Mapping[str, Any]) -> str:
    return "settings: " + ", ".join(f"{k}={v}" for k, v in settings.items())


# ---------------------------------------------------------------------------- output


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; numbers right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    numeric = [bool(cells) and all(_is_number(r[i]) for r in cells) for i in range(len(headers))]
    fmt = lambda row: "| " + " | ".join(c.rjust(w) if n else c.ljust(w)  # noqa: E731
                                        for c, w, n in zip(row, widths, numeric)) + " |"
    rule = "|" + "|".join(("-" * (w + 1) + ":") if n else ("-" * (w + 2)) for w, n in zip(widths, numeric)) + "|"
    return "\n".join([fmt(headers), rule, *(fmt(r) for r in cells)])


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", "").rstrip("x%"))
        return True
    except ValueError:
        return text in ("-", "")


def fmt_bytes(n: float) -> str:
    return f"{n / GIB:,.2f} GiB" if n >= GIB else f"{n / MIB:,.1f} MiB"


def progress(message: str) -> None:
    """A progress line on stderr (stdout holds only the report)."""
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def error_name(e: BaseException) -> str:
    return type(e).__name__


def short_error(e: BaseException, limit: int = 160) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def is_oom(e: BaseException) -> bool:
    text = str(e)
    return any(s in text for s in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM"))


# ---------------------------------------------------------------------------- timing


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def best_seconds(run_calls: Callable[[int], Any], *, repeats: int, min_window_s: float) -> float:
    """Seconds per call: the best of `repeats` windows, each `run_calls(calls)` (back-to-back calls,
    returning when all results are ready) at least `min_window_s` long, after a warm-up call."""
    run_calls(1)

    def window(calls: int) -> float:
        return timed(lambda: run_calls(calls))[1] / calls

    calls = max(1, math.ceil(min_window_s / window(1)))
    return min(window(calls) for _ in range(repeats))


# ---------------------------------------------------------------------------- t5x_lite


def make_trainer(model_config: Any, *, total_steps: int = 10_000):
    """A `Trainer` as `training.loop.train` builds one: default data-parallel mesh and rules, AdamW."""
    from t5x_lite.parallel import partitioning
    from t5x_lite.training import trainer as trainer_lib
    from t5x_lite.training.optim import AdamW

    return trainer_lib.Trainer.for_run(model=model_config, optimizer=AdamW(), total_steps=total_steps,
                                       mesh=partitioning.make_mesh(), rules=partitioning.DEFAULT_RULES)


def make_batch(model_config: Any, *, batch: int, length: int, inputs_length: int | None = None,
               packed_segments: int = 0, seed: int = 0) -> dict[str, np.ndarray]:
    """Random tokens in seqio's feature names; no padding, so every target token counts.

    packed_segments > 0 adds the features packing produces (as gin/runs/pretrain.gin trains,
    DataConfig.pack = True): each row holds that many equal segments, with `*_segment_ids`
    and `*_positions` restarting in each.
    """
    rng = np.random.default_rng(seed)
    tokens = lambda n: rng.integers(1, model_config.vocab_size, size=(batch, n)).astype(np.int32)  # noqa: E731
    out = {"decoder_input_tokens": tokens(length), "decoder_target_tokens": tokens(length),
           "decoder_loss_weights": np.ones((batch, length), np.float32)}
    prefixes = {"decoder": length}
    if "encoder_input_tokens" in model_config.init_inputs():
        out["encoder_input_tokens"] = tokens(inputs_length or length)
        prefixes["encoder"] = inputs_length or length
    if packed_segments:
        for prefix, n in prefixes.items():
            segment = np.arange(n) * packed_segments // n  # equal segments 0 .. packed_segments-1
            start = np.searchsorted(segment, segment)  # first index of each position's segment
            out[f"{prefix}_segment_ids"] = np.broadcast_to(segment + 1, (batch, n)).astype(np.int32)
            out[f"{prefix}_positions"] = np.broadcast_to(np.arange(n) - start, (batch, n)).astype(np.int32)
    return out


def global_batch(trainer, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
    from t5x_lite.parallel import partitioning

    return partitioning.host_batch_to_global(batch, trainer.batch_sharding)


@dataclasses.dataclass
class CompiledStep:
    lowered: Any
    compiled: Any
    lower_seconds: float
    compile_seconds: float


def compile_train_step(trainer, batch: Mapping[str, np.ndarray]) -> CompiledStep:
    """`Trainer.lower_train_step(batch).compile()`, each part timed; nothing is allocated."""
    lowered, lower_s = timed(lambda: trainer.lower_train_step(batch))
    compiled, compile_s = timed(lowered.compile)
    return CompiledStep(lowered, compiled, lower_s, compile_s)


def flops_per_token(model_config: Any, length: int, inputs_length: int | None = None) -> float:
    """The library's training FLOPs per (target) token, exactly as `training.loop.train` computes it for MFU."""
    return model_config.train_flops_per_token(targets_length=length, inputs_length=inputs_length)


def timed_steps(step: Callable, state: Any, *args: Any, warmup: int, windows: int, steps: int):
    """Runs `warmup` steps, then `windows` timed windows of `steps` steps each.

    Only the end of a window waits for the device, as a training loop would. Returns the final
    (state, metrics), the seconds of the first warm-up step (the compile included, when the step
    was not compiled ahead) and the seconds per step of each window.
    """
    start, first = time.perf_counter(), None
    for _ in range(warmup):
        state, metrics = step(state, *args)
        jax.block_until_ready((state, metrics))
        first = first or time.perf_counter() - start
    per_step = []
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(steps):
            state, metrics = step(state, *args)
        jax.block_until_ready((state, metrics))
        per_step.append((time.perf_counter() - start) / steps)
    return state, metrics, first, per_step


def mfu(flops_token: float, tokens_per_second: float, peak: float) -> float:
    from t5x_lite.metrics import arithmetic as metric_math

    return metric_math.model_flops_utilization(flops_per_token=flops_token, tokens_per_second=tokens_per_second,
                                           peak_flops_per_device=peak, num_devices=jax.device_count())
