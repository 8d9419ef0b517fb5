"""The human-readable report of `t5x-lite estimate`: aligned sections of label, value and note.

Only formatting lives here: `format_report` turns the JSON-able result of `command.estimate`
(what `--json` prints) into text, with bytes, FLOPs and durations in readable units.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

GIB = 2**30
MIB = 2**20

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
                 f"rows of the token stream / batch {d['batch_size']}: exact (read by index)" if d.get("exact")
                 else f"tokens / ({lengths}) if packing filled every row: at least this")]
    limits = f"TRAIN_STEPS={d['train_steps']}, NUM_EPOCHS={d['num_epochs']}"
    return rows + [("planned steps", f"{d['planned_steps']:,}" if d["planned_steps"] else "unknown", limits)]


def _memory_rows(mem: Mapping[str, Any], sequence_length: int) -> list[tuple[str, str, str]]:
    offloaded = [("  offloaded to host", _bytes(mem["activations_host"]), "")] if mem["activations_host"] else []
    return [
        ("parameters", _bytes(mem["params"]), "float32, sharded by the logical-axis rules"),
        ("optimizer state", _bytes(mem["optimizer_state"]), mem["optimizer"]),
        ("gradients", _bytes(mem["gradients"]), "float32 (x2 with microbatches: the accumulator)"),
        ("state total", _bytes(mem["state_total"]), ""),
        *([("gathered weights", _bytes(mem["gathered"]),
            "whole weights at the step's peak (FSDP): unscanned ones, the largest twice, or one layer's x2")]
          if mem.get("gathered") else []),
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
