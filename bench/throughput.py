"""throughput: training tokens/s and MFU of each model family on this device.

Families: `llama` (decoder-only, RoPE, RMSNorm, SwiGLU), `gpt2` (decoder-only, learned
positions, LayerNorm, GELU, biases, tied embeddings) and `t5` (T5 v1.1 encoder-decoder with
half the layers in each stack, inputs as long as targets by default, so its matmul work per
target token is close to the decoders'). Each runs `Trainer.train_step` (AdamW) on random
tokens packed as pretraining packs them (--packed_segments per row, with segment ids and
positions; 0: unpacked rows). The first --warmup_steps steps (compile included) are
excluded; then --windows windows of --steps steps are timed, each ending with one
block_until_ready on the last state and metrics. tokens/s counts target tokens (batch x
seq_len); MFU is the library's flops_per_token (for T5 with inputs_length) x tokens/s over
the measured matmul peak of the same dtype (matmul_peak, or --peak_flops / --peak_flops_bf16).
"""

from __future__ import annotations

import statistics

import jax

from bench import common, matmul_peak

DEFAULTS = {"families": "llama,gpt2,t5", "dtypes": "float32,bfloat16", "emb_dim": 512, "num_layers": 4,
            "num_heads": 8, "head_dim": 64, "mlp_dim": 1408, "vocab_size": 8192, "seq_len": 256, "batch_size": 8,
            "t5_inputs_len": None, "packed_segments": 4, "scan_layers": 1, "scan_unroll": 1, "warmup_steps": 2,
            "steps": 5, "windows": 3, "peak_flops": None, "peak_flops_bf16": None}
QUICK = {"emb_dim": 64, "num_layers": 2, "num_heads": 2, "head_dim": 32, "mlp_dim": 128, "vocab_size": 512,
         "seq_len": 64, "batch_size": 2, "warmup_steps": 1, "steps": 3, "windows": 2}


def add_arguments(parser) -> None:
    parser.add_argument("--families", help="comma-separated: llama,gpt2,t5")
    parser.add_argument("--dtypes", help="comma-separated compute dtypes (default float32,bfloat16)")
    for key in ("emb_dim", "num_layers", "num_heads", "head_dim", "mlp_dim", "vocab_size", "seq_len", "batch_size",
                "t5_inputs_len", "packed_segments", "warmup_steps", "steps", "windows"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]}")
    parser.add_argument("--scan_layers", type=int, choices=(0, 1),
                        help="1: layers stacked by scan (the models' default); 0: unrolled")
    parser.add_argument("--scan_unroll", type=int,
                        help="scanned layers per loop iteration (default 1); the number of layers: no loop, "
                             "the same stacked parameters")
    parser.add_argument("--peak_flops", type=float, help="float32 peak FLOP/s for MFU (default: measure)")
    parser.add_argument("--peak_flops_bf16", type=float, help="bfloat16 peak FLOP/s for MFU (default: measure)")


def model_config(family: str, dtype: str, s: dict):
    from t5x_lite.models.decoder_only import DecoderConfig
    from t5x_lite.models.encoder_decoder import T5Config

    shared = dict(vocab_size=s["vocab_size"], emb_dim=s["emb_dim"], num_heads=s["num_heads"],
                  head_dim=s["head_dim"], dtype=dtype, scan_layers=bool(s.get("scan_layers", 1)),
                  scan_unroll=s.get("scan_unroll", 1))
    if family == "llama":
        return DecoderConfig(**shared, num_kv_heads=s["num_heads"], mlp_dim=s["mlp_dim"],
                             num_layers=s["num_layers"], max_len=s["seq_len"])
    if family == "gpt2":
        return DecoderConfig(**shared, num_kv_heads=s["num_heads"], mlp_dim=4 * s["emb_dim"],
                             num_layers=s["num_layers"], max_len=s["seq_len"], position_embedding="learned",
                             norm="layernorm", mlp_activations=("gelu",), use_bias=True, tie_embeddings=True)
    if family == "t5":
        half = max(1, s["num_layers"] // 2)
        return T5Config(**shared, mlp_dim=s["mlp_dim"], num_encoder_layers=half, num_decoder_layers=half)
    raise ValueError(f"Unknown family {family!r}; choose from llama, gpt2, t5.")


def measure(family: str, dtype: str, s: dict) -> dict:
    cfg = model_config(family, dtype, s)
    inputs_len = s["t5_inputs_len"] or s["seq_len"]
    batch = common.make_batch(cfg, batch=s["batch_size"], length=s["seq_len"], inputs_length=inputs_len,
                              packed_segments=s["packed_segments"])
    trainer = common.make_trainer(cfg)
    state = trainer.init_state(jax.random.PRNGKey(0), batch)
    batch = common.global_batch(trainer, batch)
    rng = jax.random.PRNGKey(1)

    state, metrics, first, seconds = common.timed_steps(trainer.train_step, state, batch, rng,
                                                        warmup=s["warmup_steps"], windows=s["windows"],
                                                        steps=s["steps"])
    tokens = s["batch_size"] * s["seq_len"]
    return {"cfg": cfg, "first_step_s": first, "step_s": statistics.median(seconds), "best_step_s": min(seconds),
            "tokens": tokens, "flops_token": common.flops_per_token(cfg, s["seq_len"], inputs_len),
            "loss": float(metrics["loss_sum"] / metrics["weight_sum"])}


def peaks(s: dict, quick: bool) -> tuple[dict[str, float], str]:
    """{dtype: peak FLOP/s} and where it came from."""
    given = {"float32": s["peak_flops"], "bfloat16": s["peak_flops_bf16"]}
    wanted = [d for d in common.strs(s["dtypes"]) if not given.get(d)]
    if not wanted:
        return given, "--peak_flops / --peak_flops_bf16"
    settings = {**matmul_peak.DEFAULTS, **(matmul_peak.QUICK if quick else {}), "dtypes": ",".join(wanted)}
    _, measured = matmul_peak.measure(settings)
    return {**given, **measured}, f"measured in-process by matmul_peak ({common.settings_line(settings)})"


def run(args, command: str) -> None:
    s = common.resolve(args, DEFAULTS, QUICK)
    if s["warmup_steps"] < 1:
        raise SystemExit("--warmup_steps must be at least 1 (the first step compiles).")
    peak, peak_source = peaks(s, args.quick)
    peak_source = getattr(args, "peak_source", peak_source)
    rows = []
    for family in common.strs(s["families"]):
        for dtype in common.strs(s["dtypes"]):
            common.progress(f"throughput: {family} {dtype}")
            r = measure(family, dtype, s)
            rate, best = r["tokens"] / r["step_s"], r["tokens"] / r["best_step_s"]
            rows.append([family, dtype, f"{r['cfg'].num_params():,}", r["tokens"], f"{r['flops_token'] / 1e6:,.1f}",
                         f"{r['first_step_s']:.1f}", f"{r['step_s'] * 1e3:,.1f}", f"{rate:,.0f}", f"{best:,.0f}",
                         f"{100 * common.mfu(r['flops_token'], rate, peak[dtype]):.1f}%",
                         f"{peak[dtype] / 1e9:,.1f}", f"{r['loss']:.3f}"])
    print(common.header(command))
    print()
    print(common.table(["family", "dtype", "params", "tokens/step", "MFLOP/token", "compile+1st step s",
                        "step ms (median)", "tokens/s (median)", "tokens/s (best)", "MFU (median)",
                        "peak GFLOP/s", "loss"], rows))
    print()
    print(f"MFU peak: {peak_source}. T5 rows count target tokens; MFLOP/token includes the encoder's work "
          f"on {s['t5_inputs_len'] or s['seq_len']} input tokens per row.")
    print(common.settings_line(s))
