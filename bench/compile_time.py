"""compile_time: compiling the full train step with scan_layers True vs False.

For each layer count, a fresh Trainer's jitted train step (forward, backward, AdamW update)
is lowered from abstract state (tracing + StableHLO) and compiled by XLA, each part timed;
the best of --repeats is kept. One 1-layer compile runs first so backend start-up is not
charged to the first row. The persistent compilation cache is off (bench/common.py).
"""

from __future__ import annotations

from bench import common

DEFAULTS = {"layers": "6,12,24,48", "emb_dim": 256, "num_heads": 4, "head_dim": 64, "mlp_dim": 1024,
            "vocab_size": 4096, "seq_len": 128, "batch_size": 4, "dtype": "float32", "repeats": 1}
QUICK = {"layers": "2,4"}


def add_arguments(parser) -> None:
    parser.add_argument("--layers", help=f"comma-separated layer counts (default {DEFAULTS['layers']})")
    for key in ("emb_dim", "num_heads", "head_dim", "mlp_dim", "vocab_size", "seq_len", "batch_size", "repeats"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]}")
    parser.add_argument("--dtype", help="compute dtype (default float32)")


def model_config(settings: dict, *, num_layers: int, scan: bool):
    from t5x_lite.models.decoder_only import DecoderConfig

    return DecoderConfig(vocab_size=settings["vocab_size"], emb_dim=settings["emb_dim"],
                         num_heads=settings["num_heads"], num_kv_heads=settings["num_heads"],
                         head_dim=settings["head_dim"], mlp_dim=settings["mlp_dim"], num_layers=num_layers,
                         max_len=settings["seq_len"], dtype=settings["dtype"], scan_layers=scan)


def compile_seconds(settings: dict, *, num_layers: int, scan: bool) -> tuple[float, float]:
    """(lower seconds, compile seconds), the best of `repeats` fresh trainers."""
    best = None
    for _ in range(settings["repeats"]):
        cfg = model_config(settings, num_layers=num_layers, scan=scan)
        batch = common.make_batch(cfg, batch=settings["batch_size"], length=settings["seq_len"])
        step = common.compile_train_step(common.make_trainer(cfg), batch)
        times = (step.lower_seconds, step.compile_seconds)
        best = times if best is None or sum(times) < sum(best) else best
    return best


def run(args, command: str) -> None:
    settings = common.resolve(args, DEFAULTS, QUICK)
    common.progress("compile_time: warm-up compile (1 layer)")
    compile_seconds({**settings, "repeats": 1}, num_layers=1, scan=True)
    rows = []
    for layers in common.ints(settings["layers"]):
        result = {}
        for scan in (True, False):
            common.progress(f"compile_time: {layers} layers, scan_layers={scan}")
            result[scan] = compile_seconds(settings, num_layers=layers, scan=scan)
        (sl, sc), (ul, uc) = result[True], result[False]
        rows.append([layers, f"{sl:.2f}", f"{sc:.2f}", f"{sl + sc:.2f}", f"{ul:.2f}", f"{uc:.2f}", f"{ul + uc:.2f}",
                     f"{(ul + uc) / (sl + sc):.2f}x"])
    print(common.header(command))
    print()
    print(common.table(["layers", "scan: lower s", "scan: compile s", "scan: total s", "unrolled: lower s",
                        "unrolled: compile s", "unrolled: total s", "unrolled / scan"], rows))
    print()
    print("lower = trace + StableHLO lowering of the train step (Trainer.lower_train_step); "
          "compile = XLA compile (.compile()); decoder-only LLaMA style, AdamW, best of repeats; persistent compilation cache off.")
    print(common.settings_line(settings))
