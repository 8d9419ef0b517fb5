"""step_ab: variants of the train step timed in one process, in alternating windows.

Separate runs of a benchmark compare badly on a shared machine: its speed drifts by 10-20%
within minutes (bench/NOTES.md), more than most changes to a step are worth. Here each
variant is compiled once in the same process, then the variants take turns: --rounds rounds,
each running a window of --steps steps of every variant (in the order given on even rounds,
reversed on odd ones, so no variant always follows the same other). A variant's time in a round
over the first variant's in the same round is a paired ratio, which drift common to both cancels
out of; the report gives each variant's median and min ms per step, the median and range of
its paired ratios, its compiled temp memory, and its loss after the timed steps (each variant
starts from the same parameters and trains on the same batch of random tokens, unless it changes
their shapes or vocabulary, so a variant that only changes how the step runs ends near the
first one's loss: XLA's order of operations changes the rounding, and over tens of steps on one
batch the losses can part by a percent or so; a wrong result parts by far more).

--variant NAME[:SETTING=VALUE,...], repeated, the first being the baseline. A SETTING is a
field of the model's config (`scan_unroll=4`, `remat_policy=full`, `attention_implementation=xla`),
applied with `dataclasses.replace`, or an XLA option (`xla_cpu_experimental_ynn_fusion_type=`,
`xla_cpu_enable_fast_math=true`), passed to that variant's compile as `compiler_options`.
VALUE reads as an int, a float, true/false, else text (empty allowed). The model is
step_profile's: `throughput`'s (--family) or gin/models/NAME.gin (--model) in bfloat16.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Mapping, Sequence

import jax

from bench import common, step_profile

DEFAULTS = {**step_profile.MODEL_DEFAULTS, "warmup_steps": 2, "steps": 3, "rounds": 8,
            "variant": ["as_configured", "loop_free:scan_unroll=4"]}
QUICK = {"warmup_steps": 1, "steps": 2, "rounds": 2, "variant": ["as_configured", "loop_free:scan_unroll=2"]}


@dataclasses.dataclass(frozen=True)
class Variant:
    """A named change to the step: model config fields and XLA compiler options."""

    name: str
    model: Mapping[str, Any]
    xla: Mapping[str, Any]

    def describe(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in {**self.model, **self.xla}.items()) or "as configured"


def _value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_variant(text: str, config_fields: Sequence[str]) -> Variant:
    """`NAME[:SETTING=VALUE,...]` -> Variant; a SETTING is a model config field or an `xla_` option."""
    name, _, settings = text.partition(":")
    if not name:
        raise ValueError(f"--variant {text!r}: give it a name, as NAME or NAME:SETTING=VALUE,...")
    model, xla = {}, {}
    for item in filter(None, settings.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--variant {text!r}: {item!r} is not SETTING=VALUE")
        if key.startswith("xla_"):
            xla[key] = _value(value)
        elif key in config_fields:
            model[key] = _value(value)
        else:
            raise ValueError(f"--variant {text!r}: {key!r} is neither a field of the model's config nor an "
                             f"XLA option (xla_...); the config's fields: {', '.join(sorted(config_fields))}")
    return Variant(name, model, xla)


def paired_ratios(times: Mapping[str, Sequence[float]], base: str) -> dict[str, tuple[float, float, float]]:
    """{variant: (median, min, max)} of its time in each round over the base variant's in that round."""
    out = {}
    for name, seconds in times.items():
        ratios = [t / b for t, b in zip(seconds, times[base])]
        out[name] = (statistics.median(ratios), min(ratios), max(ratios))
    return out


def add_arguments(parser) -> None:
    step_profile.add_model_arguments(parser)
    for key in ("warmup_steps", "steps", "rounds"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]}")
    parser.add_argument("--variant", action="append",
                        help="NAME[:SETTING=VALUE,...], repeated; the first is the baseline (default: "
                             f"{' and '.join(DEFAULTS['variant'])})")


def _compile(cfg, variant: Variant, s: Mapping[str, Any]) -> dict[str, Any]:
    cfg = dataclasses.replace(cfg, **variant.model)
    batch = common.make_batch(cfg, batch=s["batch_size"], length=s["seq_len"], packed_segments=s["packed_segments"])
    trainer = common.make_trainer(cfg)
    try:
        compiled = trainer.lower_train_step(batch).compile(compiler_options=dict(variant.xla) or None)
    except jax.errors.JaxRuntimeError as e:
        if "INVALID_ARGUMENT" not in str(e):
            raise
        raise SystemExit(f"--variant {variant.name}: XLA refused its options ({e}).") from None
    state = trainer.init_state(jax.random.PRNGKey(0), batch)
    args = (common.global_batch(trainer, batch), trainer.replicated(jax.random.PRNGKey(1)))
    temp = compiled.memory_analysis().temp_size_in_bytes
    return {"step": compiled, "state": state, "args": args, "temp": temp, "seconds": [], "metrics": None}


def run(args, command: str) -> dict:
    """Prints the report; returns the settings and, per variant, its ms per step and paired ratio."""
    s = common.resolve(args, DEFAULTS, QUICK)
    s["tiny"] = bool(args.quick)
    s["seq_len"] = s["seq_len"] or step_profile.default_seq_len(s)
    cfg = step_profile.model_config(s)
    if min(s["steps"], s["rounds"]) < 1 or s["warmup_steps"] < 0:
        raise SystemExit("--steps and --rounds must each be at least 1, --warmup_steps at least 0.")
    try:
        variants = [parse_variant(v, [f.name for f in dataclasses.fields(cfg)]) for v in s["variant"]]
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if len(variants) < 2 or len({v.name for v in variants}) != len(variants):
        raise SystemExit(f"step_ab compares two or more --variant, each with its own name, not {s['variant']}.")
    runs = {}
    for v in variants:
        common.progress(f"step_ab: compiling {v.name} ({v.describe()})")
        runs[v.name] = _compile(cfg, v, s)
        r = runs[v.name]
        r["state"], *_ = common.timed_steps(r["step"], r["state"], *r["args"], warmup=s["warmup_steps"], windows=0,
                                            steps=0)
    names = [v.name for v in variants]
    common.progress(f"step_ab: {s['rounds']} rounds of {s['steps']} steps per variant")
    for round_index in range(s["rounds"]):
        for name in names if round_index % 2 == 0 else names[::-1]:
            r = runs[name]
            r["state"], r["metrics"], _, (seconds,) = common.timed_steps(
                r["step"], r["state"], *r["args"], warmup=0, windows=1, steps=s["steps"])
            r["seconds"].append(seconds)
    ratios = paired_ratios({name: runs[name]["seconds"] for name in names}, names[0])
    tokens = s["batch_size"] * s["seq_len"]
    rows, result = [], {}
    for v in variants:
        r = runs[v.name]
        median, loss = statistics.median(r["seconds"]), float(r["metrics"]["loss_sum"] / r["metrics"]["weight_sum"])
        rows.append([v.name, v.describe(), f"{median * 1e3:,.1f}", f"{min(r['seconds']) * 1e3:,.1f}",
                     f"{tokens / median:,.0f}", f"{ratios[v.name][0]:.3f}",
                     f"{ratios[v.name][1]:.3f}-{ratios[v.name][2]:.3f}", f"{r['temp'] / common.MIB:,.1f}",
                     f"{loss:.5f}"])
        result[v.name] = {"ms_per_step": median * 1e3, "paired_ratio": ratios[v.name], "temp_bytes": r["temp"],
                          "loss": loss}
    print(common.header(command))
    print()
    print(f"{s['model'] or s['family']}, {cfg.dtype}, batch {s['batch_size']} x seq {s['seq_len']}: {s['rounds']} "
          f"rounds, each a window of {s['steps']} steps per variant, the order reversed every other round.\n")
    print(common.table(["variant", "settings", "median ms per step", "min", "tokens/s (median)",
                        f"time / {names[0]} (median of rounds)", "range", "compiled temp MiB", "loss after"], rows))
    print()
    print(f"A paired ratio is a variant's time in one round over {names[0]}'s in the same round; under 1 is "
          f"faster. The loss is the last timed step's, every variant having trained the same batch from the same "
          f"parameters: equal up to rounding (a percent or so after tens of steps) for a change that leaves the "
          f"math alone.")
    print(common.settings_line(s))
    return {"settings": s, "variants": result}
