"""large_models: the large-model path on 8 host devices, compile-only: memory, collectives, compile time.

For each model file (default: the 1.3B decoder and the T5-XL-sized encoder-decoder) under each
shipped mesh file (data_parallel, fsdp, fsdp_tensor), the real train step (runs/pretrain.gin,
batch --batch_size, the model's own dtype and remat policy) is lowered from an abstract state
and compiled on 8 host CPU devices; nothing is allocated or run.

1. Memory per device: `t5x-lite estimate`'s arithmetic (train state, gradients, gathered weights,
   activations, logits) next to XLA's memory analysis of the compiled step (arguments, temp, and the peak
   arguments + outputs - aliased + temp), and their ratio. The train state is exact by
   construction (arguments minus the batch); the rest is XLA:CPU's buffer assignment.
2. Collectives from the compiled HLO (t5x_lite/estimate/collectives.py): count and MiB per
   device of all-gathers, reduce-scatters and all-reduces in each scanned loop's body (run once
   per layer) and outside the loops, next to the per-layer weight arrays the rules shard.
3. Compile time vs depth: the first model under fsdp at --depths layers (scanned: flat).

Run as its own process: it asks JAX for 8 host devices before JAX starts.
"""

from __future__ import annotations

import math

from bench import common

DEFAULTS = {"models": "decoder_1_3b,t5_xl", "meshes": "data_parallel,fsdp,fsdp_tensor", "depths": "6,12,24,48",
            "batch_size": 16, "seq_len": 256, "inputs_length": 512, "targets_length": 128}
QUICK = {"models": "decoder_tiny,t5_tiny", "depths": "2,4"}
DEVICES = 8


def add_arguments(parser) -> None:
    parser.add_argument("--models", help=f"gin/models files (default {DEFAULTS['models']})")
    parser.add_argument("--meshes", help=f"gin/mesh files (default {DEFAULTS['meshes']})")
    parser.add_argument("--depths", help=f"layer counts for compile time (default {DEFAULTS['depths']})")
    for key in ("batch_size", "seq_len", "inputs_length", "targets_length"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]} (seq_len: decoders; "
                                                        "inputs/targets_length: encoder-decoders)")


def settings_for(model: str, mesh: str, s: dict, extra: tuple[str, ...] = ()):
    from t5x_lite.config import resolve as config_resolve
    from t5x_lite.estimate.run_from_gin import run_settings

    lengths = ([f"INPUTS_LENGTH={s['inputs_length']}", f"SEQUENCE_LENGTH={s['targets_length']}"]
               if model.startswith("t5") else [f"SEQUENCE_LENGTH={s['seq_len']}"])
    resolved = config_resolve.load_run(
        gin_files=[f"models/{model}.gin", f"mesh/{mesh}.gin", "runs/pretrain.gin"],
        gin_bindings=["TRAIN_STEPS=1000", "MIXTURE_OR_TASK_NAME=None", f"BATCH_SIZE={s['batch_size']}", *lengths,
                      *extra], entry="train", check_macros=False)
    return run_settings(resolved)


def sharded_layer_arrays(trainer) -> str:
    """Weight arrays of one layer of each scanned stack that the mesh splits (what FSDP gathers per
    layer): '9' for a decoder, '9 + 14' for T5's encoder and decoder."""
    import jax

    counts: dict[str, int] = {}
    for path, sharding in jax.tree_util.tree_flatten_with_path(trainer.state_shardings.params)[0]:
        names = [str(getattr(k, "key", "")) for k in path]
        stack = next((i for i, n in enumerate(names) if "layers" in n), None)
        if stack is not None:
            key = "/".join(names[:stack + 1])
            counts[key] = counts.get(key, 0) + (not sharding.is_fully_replicated)
    return " + ".join(str(n) for n in counts.values()) or "0"


def measure(model: str, mesh: str, s: dict) -> dict:
    from t5x_lite.estimate import collectives, layout, memory
    from t5x_lite.training import trainer as trainer_lib

    settings = settings_for(model, mesh, s)
    mesh_shape, _ = layout.check_layout(settings, num_devices=DEVICES)
    arithmetic = memory.memory_estimate(settings, mesh_shape, platform="cpu")
    compiled, trainer, seconds, batch_bytes = memory.compile_train_step(settings, num_devices=DEVICES)
    xla = trainer_lib.compiled_memory_bytes(compiled.memory_analysis())
    return {"model": model, "mesh": mesh, "shape": mesh_shape, "params": settings.model.num_params(),
            "arithmetic": arithmetic, "xla": xla, "batch_bytes": batch_bytes, "seconds": seconds,
            "groups": collectives.collectives(compiled.as_text()),
            "sharded_layer_arrays": sharded_layer_arrays(trainer)}


def _gib(n: float) -> str:
    return f"{n / common.GIB:.2f}"


def _collective_text(group) -> str:
    return ", ".join(f"{group.counts[k]} {k} ({group.bytes[k] / common.MIB:,.0f} MiB)" for k in group.counts) or "none"


def run(args, command: str) -> dict:
    from t5x_lite.estimate import memory

    memory.request_cpu_devices(DEVICES)  # before anything starts JAX's backends
    s = common.resolve(args, DEFAULTS, QUICK)
    print(common.header(command))
    print(common.settings_line(s))
    results = []
    for model in common.strs(s["models"]):
        for mesh in common.strs(s["meshes"]):
            common.progress(f"large_models: compiling {model} on {mesh}")
            results.append(measure(model, mesh, s))

    print(f"\nmemory per device, arithmetic (`t5x-lite estimate`) vs XLA's analysis of the compiled step "
          f"({DEVICES} x cpu), GiB:\n")
    rows = []
    for r in results:
        a, x = r["arithmetic"], r["xla"]
        state_exact = x["arguments"] - r["batch_bytes"] - a["train_state"]
        rows.append([r["model"], r["mesh"], " x ".join(f"{k}={v}" for k, v in r["shape"].items() if v > 1),
                     _gib(a["train_state"]), f"{state_exact:+,d} B", _gib(a["gradients"]), _gib(a["gathered"]),
                     _gib(a["activations"] + a["logits"]), _gib(a["total"]), _gib(x["temp"]), _gib(x["total"]),
                     f"{x['total'] / a['total']:.2f}", f"{r['seconds']:.1f}"])
    header = ["model", "mesh", "shape", "state", "XLA args - batch - state (a)", "grads", "gathered",
              "acts + logits", "estimate total", "XLA temp", "XLA total", "XLA / estimate", "compile s"]
    print(common.table(header, rows))
    print("\n(a) 0 when the compiled arguments are the arithmetic's train state plus the batch; negative by the batch "
          "features the step never reads, which jit prunes (T5's position features: it uses relative positions).")

    print("\ncollectives per device from the compiled HLO: each scanned loop's body runs once per layer "
          "(trips); 'sharded arrays' = weight arrays of one layer that the mesh splits:\n")
    rows = []
    for r in results:
        for name, group in r["groups"].items():
            where = "outside the loops" if name == "outside" else f"loop body x{group.trips}"
            rows.append([r["model"], r["mesh"], r["sharded_layer_arrays"], where, _collective_text(group)])
    print(common.table(["model", "mesh", "sharded arrays", "where", "collectives (count, MiB each run)"], rows))

    first = common.strs(s["models"])[0]
    rows = []
    for depth in common.ints(s["depths"]):
        common.progress(f"large_models: compile time of {first} with {depth} layers")
        field = "T5Config.num_encoder_layers" if first.startswith("t5") else "DecoderConfig.num_layers"
        extra = (f"{field}={depth}",) + ((f"T5Config.num_decoder_layers={depth}",) if first.startswith("t5") else ())
        settings = settings_for(first, "fsdp", s, extra)
        _, _, seconds, _ = memory.compile_train_step(settings, num_devices=DEVICES)
        rows.append([depth, f"{settings.model.num_params():,}", f"{seconds:.2f}"])
    print(f"\ncompile time vs depth ({first}, fsdp, scanned layers; lower + compile):\n")
    print(common.table(["layers", "parameters", "seconds"], rows))
    return {"results": [{k: v for k, v in r.items() if k != "groups"} for r in results],
            "max_ratio": max(r["xla"]["total"] / r["arithmetic"]["total"] for r in results) if results else math.nan}
