"""step_profile: where a train step's device time goes, by kind of op, from a jax.profiler trace.

Traces --steps calls of the jitted Trainer train step (after --warmup_steps) and sums the
time of each op the compiled step ran, by kind (matmuls, cuDNN attention, the scan's stack
writes and reads, fills, copies, reductions, ...; `KINDS`). On a GPU (or TPU) that is the
kernels on the device's streams; on CPU, the ops on XLA:CPU's threads. Each op counts its own
time (`while` and `conditional` without the ops they contain) summed over threads, so the total
can exceed the step's wall time, and its wall time: each instant split evenly among the ops
running then, so the wall times add up to the time some op ran.

The matmul table takes each op's FLOPs from the compiled step's HLO (`hlo_dots`) and gives its
GFLOP/s while it ran, which says which matmuls run below the kernel's speed alone
(`matmul_shapes`, `matmul_peak`) and how much of the step the other ops take.

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
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax

from bench import common, gpu_decoders, hlo_dots, throughput

# The options that pick the step's model and batch (`add_model_arguments`; step_ab uses them too).
MODEL_DEFAULTS = {"model": None, "family": "llama", "dtype": None, "seq_len": None, "batch_size": 8,
                  "scan_layers": None, "scan_unroll": None, "remat": None, "packed_segments": 4}
DEFAULTS = {**MODEL_DEFAULTS, "warmup_steps": 2, "steps": 3, "top": 20, "trace_dir": None}
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


def _own_segments(events: list[dict], is_runtime: Callable[[str], bool]) -> list[tuple[float, float, dict]]:
    """(start, end, op event) pieces of each op's own time on one thread: its span less the events
    nested in it (a `while` contains its body's ops). A runtime event's own time counts for the
    op it is nested in (a YNNPACK matmul waiting for its workers), or for nothing outside ops."""
    segments = []
    open_events: list[list] = []  # [end, event, owner (op event or None), time own up to]

    def emit(entry, until):
        if entry[2] is not None and until > entry[3]:
            segments.append((entry[3], until, entry[2]))

    def close():
        done = open_events.pop()
        emit(done, done[0])
        if open_events:
            open_events[-1][3] = max(open_events[-1][3], min(done[0], open_events[-1][0]))

    for e in sorted(events, key=lambda e: (e["ts"], -e.get("dur", 0))):
        start, end = e["ts"], e["ts"] + e.get("dur", 0)
        while open_events and open_events[-1][0] <= start:
            close()
        owner = open_events[-1][2] if open_events else None
        if open_events:
            emit(open_events[-1], start)
            open_events[-1][3] = start
        open_events.append([end, e, owner if is_runtime(e["name"]) else e, start])
    while open_events:
        close()
    return segments


def device_segments(trace: Mapping[str, Any]) -> list[tuple[float, float, dict]]:
    """Own-time pieces (start and end in microseconds, the op's event) of every op in a
    Chrome-format trace (`*.trace.json.gz`): the device streams' kernels when the trace has a
    device, else XLA:CPU's ops."""
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

    is_runtime = (lambda name: False) if devices else (lambda name: bool(_CPU_RUNTIME.match(name)))  # noqa: E731
    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and wanted(e):
            by_thread[(e["pid"], e["tid"])].append(e)
    return [piece for thread_events in by_thread.values() for piece in _own_segments(thread_events, is_runtime)]


def op_name(event: dict) -> str:
    return event["name"].removeprefix("end: ")


def own_times(segments: Iterable[tuple[float, float, dict]],
              key: Callable[[dict], str] = op_name) -> collections.Counter:
    """Microseconds of own time per op (`device_segments`), summed over threads and streams."""
    totals = collections.Counter()
    for start, end, event in segments:
        totals[key(event)] += end - start
    return totals


def device_op_times(trace: Mapping[str, Any]) -> collections.Counter:
    """Microseconds of own time per op name in a Chrome-format trace."""
    return own_times(device_segments(trace))


def _stretches(segments: Iterable[tuple[float, float, dict]],
               key: Callable[[dict], str]) -> Iterator[tuple[float, collections.Counter]]:
    """(microseconds, {op: pieces running}) for each stretch between two op starts or ends in which
    some op ran; the counter is the sweep's own, read it before the next stretch."""
    changes = sorted((time, delta, key(event)) for start, end, event in segments
                     for time, delta in ((start, 1), (end, -1)))
    running, previous = collections.Counter(), None
    for time, delta, name in changes:
        if previous is not None and running and time > previous:
            yield time - previous, running
        running[name] += delta
        if not running[name]:
            del running[name]
        previous = time


def wall_times(segments: Iterable[tuple[float, float, dict]],
               key: Callable[[dict], str] = op_name) -> collections.Counter:
    """Microseconds of wall time per op: each instant split evenly among the ops running then, so
    ops that run side by side on XLA:CPU's threads share it and the times add up to the time
    during which any op ran."""
    totals = collections.Counter()
    for us, running in _stretches(segments, key):
        count = sum(running.values())
        for name, n in running.items():
            totals[name] += us * n / count
    return totals


def alone_times(segments: Iterable[tuple[float, float, dict]],
                key: Callable[[dict], str] = op_name) -> collections.Counter:
    """Microseconds per op in which no other op ran. On XLA:CPU a matmul that runs on one thread
    (YNNPACK's batched products) leaves the other cores idle for that long; a YNNPACK matmul's
    workers leave no events, so a dense product alone still uses every core."""
    totals = collections.Counter()
    for us, running in _stretches(segments, key):
        if len(running) == 1:
            totals[next(iter(running))] += us
    return totals


def kind_times(op_times: Mapping[str, float]) -> collections.Counter:
    """The op times summed by `op_kind`."""
    kinds = collections.Counter()
    for name, us in op_times.items():
        kinds[op_kind(name)] += us
    return kinds


def summarize(op_times: Mapping[str, float], wall: Mapping[str, float], *, steps: int,
              top: int) -> tuple[list[list], list[list], float]:
    """Rows by kind and rows of the `top` op families, in ms per step of op time (its share) and
    of wall time (`wall_times`); and the total op ms per step."""
    total = sum(op_times.values())
    kinds, families, calls = kind_times(op_times), collections.Counter(), collections.Counter()
    kinds_wall, families_wall = kind_times(wall), collections.Counter()
    for name, us in op_times.items():
        families[op_family(name)] += us
        families_wall[op_family(name)] += wall.get(name, 0.0)
        calls[op_family(name)] += 1
    share = lambda us: f"{100 * us / total:.1f}%" if total else "-"  # noqa: E731
    ms = lambda us: f"{us / steps / 1e3:,.2f}"  # noqa: E731
    kind_rows = [[kind, ms(us), share(us), ms(kinds_wall[kind])] for kind, us in kinds.most_common()]
    family_rows = [[family, op_kind(family), calls[family], ms(us), share(us), ms(families_wall[family])]
                   for family, us in families.most_common(top)]
    return kind_rows, family_rows, total / steps / 1e3


def hlo_op(event: dict) -> str:
    """The compiled module's instruction an event ran (XLA's traces name it in `hlo_op`)."""
    return event.get("args", {}).get("hlo_op") or op_name(event)


def matmul_rows(segments: list[tuple[float, float, dict]], dots: Mapping[str, list[hlo_dots.Dot]], *, steps: int,
                top: int) -> tuple[list[list], dict[str, float]]:
    """The `top` ops that run matmuls, by wall time: their products, calls per step, ms per call,
    GFLOP/s while each ran, wall ms per step, ms per step with no other op beside it; and the
    totals of all of them per step (GFLOP, wall ms, GFLOP/s in wall time)."""
    own = {name: us for name, us in own_times(segments, hlo_op).items() if name in dots}
    calls = collections.defaultdict(set)
    for _, _, event in segments:
        if hlo_op(event) in dots and not event["name"].startswith("end: "):  # XLA:CPU's completion of an op
            calls[hlo_op(event)].add(id(event))                             # is an event of its own
    all_wall, alone = wall_times(segments, hlo_op), alone_times(segments, hlo_op)
    rows, total_flops = [], 0.0
    for name, _ in sorted(all_wall.items(), key=lambda item: -item[1]):
        if name not in own:
            continue
        flops = sum(dot.flops for dot in dots[name]) * len(calls[name])
        total_flops += flops
        rows.append([name, " + ".join(dot.describe() for dot in dots[name]), f"{len(calls[name]) / steps:g}",
                     f"{own[name] / len(calls[name]) / 1e3:,.2f}", f"{flops / own[name] / 1e3:,.1f}",
                     f"{all_wall[name] / steps / 1e3:,.2f}", f"{alone[name] / steps / 1e3:,.2f}"])
    matmul_wall = sum(all_wall[name] for name in own)
    totals = {"gflop": total_flops / steps / 1e9, "wall_ms": matmul_wall / steps / 1e3,
              "gflops": total_flops / matmul_wall / 1e3 if matmul_wall else 0.0}
    return rows[:top], totals


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


def trace_steps(s: dict, trace_dir: str) -> tuple[Any, float, str]:
    """Compiles and warms up the step, then traces `steps` of them; the config, wall s per step and
    the compiled module's text."""
    cfg = model_config(s)
    batch = common.make_batch(cfg, batch=s["batch_size"], length=s["seq_len"], packed_segments=s["packed_segments"])
    trainer = common.make_trainer(cfg)
    step = common.compile_train_step(trainer, batch).compiled
    hlo_text = step.as_text()
    state = trainer.init_state(jax.random.PRNGKey(0), batch)
    args = (common.global_batch(trainer, batch), trainer.replicated(jax.random.PRNGKey(1)))
    state, *_ = common.timed_steps(step, state, *args, warmup=s["warmup_steps"], windows=0, steps=0)
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        _, _, _, (wall,) = common.timed_steps(step, state, *args, warmup=0, windows=1, steps=s["steps"])
    return cfg, wall, hlo_text


def add_model_arguments(parser) -> None:
    """The options that pick the step's model and batch (`MODEL_DEFAULTS`)."""
    parser.add_argument("--model", help="gin/models/NAME.gin in bfloat16, as gpu_decoders runs it (default: "
                                        "throughput's model, --family)")
    parser.add_argument("--family", choices=("llama", "gpt2", "t5"), help="throughput's model (default llama)")
    parser.add_argument("--dtype", help="compute dtype (default float32 for --family, bfloat16 for --model)")
    for key in ("seq_len", "batch_size", "packed_segments"):
        parser.add_argument(f"--{key}", type=int, help=f"default {MODEL_DEFAULTS[key]}")
    parser.add_argument("--scan_layers", type=int, choices=(0, 1), help="default: the model's (scanned)")
    parser.add_argument("--scan_unroll", type=int, help="scanned layers per loop iteration (default: the model's, 1)")
    parser.add_argument("--remat", help="remat policy (default: none)")


def default_seq_len(s: dict) -> int:
    """64 for --quick, 2048 for --model, else throughput's."""
    return 64 if s["tiny"] else 2048 if s["model"] else throughput.DEFAULTS["seq_len"]


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    for key in ("warmup_steps", "steps", "top"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]}")
    parser.add_argument("--trace_dir", help="keep the trace here (default: a temporary directory)")


def run(args, command: str) -> dict:
    """Prints the report; returns the settings, wall and op ms per step, the op times, and the matmuls' totals."""
    s = common.resolve(args, DEFAULTS, QUICK)
    s["tiny"] = bool(args.quick)
    s["seq_len"] = s["seq_len"] or default_seq_len(s)
    with tempfile.TemporaryDirectory() as scratch:
        trace_dir = s["trace_dir"] or scratch
        common.progress(f"step_profile: {s['model'] or s['family']}, {s['steps']} steps traced")
        cfg, wall, hlo_text = trace_steps(s, trace_dir)
        paths = sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))
        with gzip.open(paths[-1]) as f:
            segments = device_segments(json.load(f))
    op_times = own_times(segments)
    op_wall = wall_times(segments)
    steps = s["steps"]
    kind_rows, family_rows, total = summarize(op_times, op_wall, steps=steps, top=s["top"])
    mm_rows, mm = matmul_rows(segments, hlo_dots.dots_by_instruction(hlo_text), steps=steps, top=s["top"])
    busy = sum(op_wall.values()) / steps / 1e3
    where = "device streams" if jax.default_backend() != "cpu" else "XLA:CPU threads, summed"
    print(common.header(command))
    print()
    print(f"{s['model'] or s['family']}, {cfg.dtype}, {cfg.num_params() / 1e6:,.1f}M params, batch {s['batch_size']} "
          f"x seq {s['seq_len']}, scan_layers={cfg.scan_layers}, scan_unroll={cfg.scan_unroll}, "
          f"remat {cfg.remat_policy}: {wall * 1e3:,.1f} ms per traced step (wall), op time {total:,.1f} ms "
          f"per step ({where}); some op ran for {busy:,.1f} ms of each step's wall time.\n")
    print(common.table(["kind", "ms per step", "share", "wall ms per step"], kind_rows))
    print()
    print(common.table(["op (without its number)", "kind", "ops", "ms per step", "share", "wall ms per step"],
                       family_rows))
    print()
    print(f"The matmuls: {mm['gflop']:,.1f} GFLOP per step (the compiled step's dots) in {mm['wall_ms']:,.1f} ms "
          f"of wall time, {mm['gflops']:,.1f} GFLOP/s; every other op {busy - mm['wall_ms']:,.1f} ms.\n")
    print(common.table(["op", "products (batch x m x k x n)", "calls per step", "ms per call",
                        "GFLOP/s while running", "wall ms per step", "alone ms per step"], mm_rows))
    print()
    print(f"`ms per step`: each op's own time (a loop or conditional without the ops inside it), summed over "
          f"{'streams' if where == 'device streams' else 'threads'}; `wall ms per step`: each instant of the step "
          f"split evenly among the ops running then (XLA:CPU runs independent ops side by side), so these add up "
          f"to the time some op ran. `ops`: distinct op names in the family. GFLOP/s while running: an op's "
          f"matmul FLOPs over its own time, whatever ran beside it; `alone`: the time no other op ran (on "
          f"XLA:CPU, for a matmul that runs on one thread, the other cores' idle time)."
          f"{' Trace kept in ' + trace_dir + '.' if s['trace_dir'] else ''}")
    print(common.settings_line(s))
    return {"settings": s, "wall_ms": wall * 1e3, "op_ms": total, "op_times": op_times, "matmuls": mm,
            "kinds": {kind: us / steps / 1e3 for kind, us in kind_times(op_times).items()}}
