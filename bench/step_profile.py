"""step_profile: where a train step's device time goes, by kind of op, from a jax.profiler trace.

Traces --steps calls of the jitted Trainer train step (after --warmup_steps) and sums the
time of each op the compiled step ran, by kind (matmuls, cuDNN attention, the scan's stack
writes and reads, fills, copies, reductions, ...; `KINDS`). On a GPU (or TPU) that is the
kernels on the device's streams; on CPU, the ops on XLA:CPU's threads, each op's own time
(`while` and `conditional` without the ops they contain), summed over the threads, so the
total can exceed the step's wall time.

The model is `throughput`'s (--family, --dtype and its sizes: d=512, 4 layers, seq 256, batch 8,
packed rows) or, with --model=NAME, gin/models/NAME.gin in bfloat16 as `gpu_decoders` trains it
(seq 2048). --trace_dir keeps the trace (TensorBoard's profile plugin or Perfetto read it).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import re
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

import jax

from bench import common, gpu_decoders, throughput

DEFAULTS = {"model": None, "family": "llama", "dtype": None, "seq_len": None, "batch_size": 8, "scan_layers": None,
            "scan_unroll": None, "remat": None, "packed_segments": 4, "warmup_steps": 2, "steps": 3, "top": 20,
            "trace_dir": None}
QUICK = {"warmup_steps": 1, "steps": 2, "top": 10}

# (kind, pattern) in order: an op's kind is the first whose pattern its name matches.
KINDS: tuple[tuple[str, str], ...] = (
    ("attention (cuDNN)", r"sdpa|fmha|cudnn"),
    ("matmuls", r"^nvjet|gemm|cublas|cutlass|^ynn_fusion|^dot\b|dot_general|^onednn"),
    ("stack writes (dynamic-update-slice)", r"dynamic[-_]update[-_]slice"),
    ("stack reads (dynamic-slice)", r"dynamic[-_]slice"),
    ("fills (broadcast, memset)", r"^wrapped_broadcast|^memset"),
    ("copies and transposes", r"copy|transpose|memcpy"),
    ("reductions", r"reduce"),
    ("concatenates", r"concatenate"),
    ("loop and conditional control", r"^while\b|^cond\b|^conditional\b"),
    ("elementwise and other", r""),
)
# Events on XLA:CPU's threads that are the runtime, not ops (they still contain ops).
_CPU_RUNTIME = re.compile(r"^(ThunkExecutor|ThreadpoolListener|SlinkyThreadPool|Wait )")
_CPU_THREADS = ("tf_XLAEigen", "tf_XLAPjRtCpuClient")


def op_kind(name: str) -> str:
    """The `KINDS` entry an op (or kernel) name falls in."""
    lowered = name.lower()
    return next(kind for kind, pattern in KINDS if re.search(pattern, lowered))


def op_family(name: str) -> str:
    """An op's name without XLA's numeric suffix (`ynn_fusion.12`, `loop_add_fusion_82`)."""
    return re.sub(r"[._]\d+$", "", name)


def _self_times(events: list[dict]) -> Iterable[tuple[str, float]]:
    """(name, own duration) of events on one thread: an event's duration less that of the events
    nested in it (a `while` contains its body's ops)."""
    open_events: list[list] = []  # [end, name, duration, time spent in children]
    finished = []

    def close(entry):
        finished.append((entry[1], entry[2] - entry[3]))

    for e in sorted(events, key=lambda e: (e["ts"], -e.get("dur", 0))):
        start, dur = e["ts"], e.get("dur", 0)
        while open_events and open_events[-1][0] <= start:
            close(open_events.pop())
        if open_events:
            parent = open_events[-1]
            parent[3] += min(start + dur, parent[0]) - start
        open_events.append([start + dur, e["name"], dur, 0.0])
    while open_events:
        close(open_events.pop())
    return finished


def device_op_times(trace: Mapping[str, Any]) -> collections.Counter:
    """Microseconds of own time per op name in a Chrome-format trace (`*.trace.json.gz`): the
    device streams' kernels when the trace has a device, else XLA:CPU's ops."""
    events = trace["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    devices = {pid for pid, name in processes.items() if name.startswith("/device:")}

    def wanted(e) -> bool:
        thread = threads.get((e["pid"], e["tid"]), "")
        if devices:
            return e["pid"] in devices and (thread.startswith("Stream") or thread == "XLA Ops")
        return thread.startswith(_CPU_THREADS)

    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and wanted(e):
            by_thread[(e["pid"], e["tid"])].append(e)
    totals = collections.Counter()
    for thread_events in by_thread.values():
        for name, own in _self_times(thread_events):
            if not devices and _CPU_RUNTIME.match(name):
                continue
            totals[name.removeprefix("end: ")] += own
    return totals


def kind_times(op_times: Mapping[str, float]) -> collections.Counter:
    """The op times summed by `op_kind`."""
    kinds = collections.Counter()
    for name, us in op_times.items():
        kinds[op_kind(name)] += us
    return kinds


def summarize(op_times: Mapping[str, float], *, steps: int, top: int) -> tuple[list[list], list[list], float]:
    """Rows by kind and rows of the `top` op families, in ms per step; and the total ms per step."""
    total = sum(op_times.values())
    kinds, families, calls = kind_times(op_times), collections.Counter(), collections.Counter()
    for name, us in op_times.items():
        families[op_family(name)] += us
        calls[op_family(name)] += 1
    share = lambda us: f"{100 * us / total:.1f}%" if total else "-"  # noqa: E731
    kind_rows = [[kind, f"{us / steps / 1e3:,.2f}", share(us)] for kind, us in kinds.most_common()]
    family_rows = [[family, op_kind(family), calls[family], f"{us / steps / 1e3:,.2f}", share(us)]
                   for family, us in families.most_common(top)]
    return kind_rows, family_rows, total / steps / 1e3


def model_config(s: dict) -> Any:
    if s["model"]:
        g = dict(gpu_decoders.DEFAULTS, tiny_stand_ins=s["tiny"], seq_len=s["seq_len"],
                 scan_layers=s["scan_layers"], scan_unroll=s["scan_unroll"])
        cfg = gpu_decoders.model_config(s["model"], s["remat"] or "none", g)
        return dataclasses.replace(cfg, dtype=s["dtype"]) if s["dtype"] else cfg
    sizes = {**throughput.DEFAULTS, **(throughput.QUICK if s["tiny"] else {}), "seq_len": s["seq_len"]}
    for key in ("scan_layers", "scan_unroll"):
        if s[key] is not None:
            sizes[key] = s[key]
    cfg = throughput.model_config(s["family"], s["dtype"] or "float32", sizes)
    return dataclasses.replace(cfg, remat_policy=s["remat"]) if s["remat"] else cfg


def trace_steps(s: dict, trace_dir: str) -> tuple[Any, float]:
    """Compiles and warms up the step, then traces `steps` of them; the config and wall s per step."""
    cfg = model_config(s)
    batch = common.make_batch(cfg, batch=s["batch_size"], length=s["seq_len"], packed_segments=s["packed_segments"])
    trainer = common.make_trainer(cfg)
    step = common.compile_train_step(trainer, batch).compiled
    state = trainer.init_state(jax.random.PRNGKey(0), batch)
    args = (common.global_batch(trainer, batch), trainer.replicated(jax.random.PRNGKey(1)))
    state, *_ = common.timed_steps(step, state, *args, warmup=s["warmup_steps"], windows=0, steps=0)
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        _, _, _, (wall,) = common.timed_steps(step, state, *args, warmup=0, windows=1, steps=s["steps"])
    return cfg, wall


def add_arguments(parser) -> None:
    parser.add_argument("--model", help="gin/models/NAME.gin in bfloat16, as gpu_decoders runs it (default: "
                                        "throughput's model, --family)")
    parser.add_argument("--family", choices=("llama", "gpt2", "t5"), help="throughput's model (default llama)")
    parser.add_argument("--dtype", help="compute dtype (default float32 for --family, bfloat16 for --model)")
    for key in ("seq_len", "batch_size", "packed_segments", "warmup_steps", "steps", "top"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]}")
    parser.add_argument("--scan_layers", type=int, choices=(0, 1), help="default: the model's (scanned)")
    parser.add_argument("--scan_unroll", type=int, help="scanned layers per loop iteration (default: the model's, 1)")
    parser.add_argument("--remat", help="remat policy (default: none)")
    parser.add_argument("--trace_dir", help="keep the trace here (default: a temporary directory)")


def run(args, command: str) -> dict:
    """Prints the report; returns the settings, wall and op ms per step, and the op times."""
    s = common.resolve(args, DEFAULTS, QUICK)
    s["tiny"] = bool(args.quick)
    s["seq_len"] = s["seq_len"] or (64 if s["tiny"] else 2048 if s["model"] else throughput.DEFAULTS["seq_len"])
    with tempfile.TemporaryDirectory() as scratch:
        trace_dir = s["trace_dir"] or scratch
        common.progress(f"step_profile: {s['model'] or s['family']}, {s['steps']} steps traced")
        cfg, wall = trace_steps(s, trace_dir)
        paths = sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))
        with gzip.open(paths[-1]) as f:
            op_times = device_op_times(json.load(f))
    kind_rows, family_rows, total = summarize(op_times, steps=s["steps"], top=s["top"])
    where = "device streams" if jax.default_backend() != "cpu" else "XLA:CPU threads, summed"
    print(common.header(command))
    print()
    print(f"{s['model'] or s['family']}, {cfg.dtype}, {cfg.num_params() / 1e6:,.1f}M params, batch {s['batch_size']} "
          f"x seq {s['seq_len']}, scan_layers={cfg.scan_layers}, scan_unroll={cfg.scan_unroll}, "
          f"remat {cfg.remat_policy}: {wall * 1e3:,.1f} ms per traced step (wall), op time {total:,.1f} ms "
          f"per step ({where}).\n")
    print(common.table(["kind", "ms per step", "share"], kind_rows))
    print()
    print(common.table(["op (without its number)", "kind", "ops", "ms per step", "share"], family_rows))
    print()
    print(f"Own time of each op (a loop or conditional without the ops inside it); `ops`: distinct op "
          f"names in the family.{' Trace kept in ' + trace_dir + '.' if s['trace_dir'] else ''}")
    print(common.settings_line(s))
    return {"settings": s, "wall_ms": wall * 1e3, "op_ms": total, "op_times": op_times,
            "kinds": {kind: us / s["steps"] / 1e3 for kind, us in kind_times(op_times).items()}}
