"""gpu_decoders: bf16 training throughput and MFU of the decoder_*.gin models on a GPU, beside PyTorch.

Each model is read from its gin file (gin/models/NAME.gin, the MODEL macro: decoder_* and gpt2_*
among others) and trained in bfloat16 (float32 parameters, AdamW) at --seq_len (default: the
model's max_len) x --batch_size. The layer layout is the gin file's; `scan_unroll = 'auto'` is
resolved as `train` resolves it (training/startup.py), against the same memory limit as the
policies below, and the `layers` column names the result. Remat policies are tried in
the order of --policies; the first that fits is used: a policy is skipped when its predicted
peak (arguments + outputs - aliased + temp, from compiled.memory_analysis()) exceeds the
device's memory limit, or when compiling or running it raises an out-of-memory error. The
step is the jitted Trainer train step, compiled ahead of time (jax.jit(...).lower(...)
.compile()) and called directly.

Attention is `jax.nn.dot_product_attention` with the model's attention_implementation
(--attention, default 'auto': cuDNN flash attention on GPUs in bf16); the `attention kernel`
column says whether the lowered step really calls cuDNN fused attention, and whether a dense
mask reaches it as a bias. Rows are packed
like pretraining's (--packed_segments segments per row, with segment ids and positions);
--cudnn_segments N passes them to cuDNN as segment offsets and lengths instead of a dense mask
(DecoderConfig.cudnn_segments_per_row).

PyTorch column (--torch auto, the default; --torch off skips it), where PyTorch is installed: the
same model trained by its PyTorch peer at the same batch and length, in the same sitting, each
model right after its JAX row, in a process of its own (`python -m bench.torch_reference`, so that
PyTorch's CUDA libraries never meet JAX's): gpt2_* as nanoGPT writes GPT-2 (torch_reference's
gpt2 style with tied embeddings), decoder_* as transformers' LlamaForCausalLM with sdpa
attention; torch.compile, bf16 autocast, fused AdamW, plain causal rows; tokens/s the median of
the same windows after the same warm-up. `JAX / PyTorch` is the ratio of tokens/s. With the
column on, JAX runs with XLA_PYTHON_CLIENT_PREALLOCATE=false unless the environment sets it, so
that the PyTorch processes get the memory JAX's steps leave (the header shows the variable).

--quick is a GPU smoke test (decoder_125m only, few steps). On CPU the script refuses to run
unless --allow_cpu, which shrinks every model to a tiny stand-in with the same code path, to
validate this script (PyTorch then runs on the CPU, without torch.compile).
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import jax

from bench import common, torch_reference
from t5x_lite.data.task_access import DataConfig
from t5x_lite.parallel import partitioning
from t5x_lite.parallel.placement import Placement
from t5x_lite.training import startup
from t5x_lite.training import trainer as trainer_lib
from t5x_lite.training.run_spec import RunSpec

DEFAULTS = {"models": "decoder_125m,decoder_350m,decoder_760m,decoder_1_3b",
            "policies": "none,minimal,save_qkv_proj,full", "seq_len": None, "batch_size": 8, "vocab_size": None,
            "warmup_steps": 2, "steps": 10, "windows": 3, "peak_flops": 989e12, "attention": "auto",
            "packed_segments": 4, "cudnn_segments": None, "scan_layers": None, "scan_unroll": None,
            "memory_limit_gib": None, "allow_cpu": False, "torch": "auto"}
QUICK = {"models": "decoder_125m", "warmup_steps": 1, "steps": 3, "windows": 1}  # a GPU smoke test
# --allow_cpu: every model shrinks to these sizes (its other switches are kept; the MLP is 4 x emb_dim,
# GPT-2's, so that the gpt2 stand-ins keep their PyTorch peer).
TINY = {"emb_dim": 64, "num_heads": 2, "num_kv_heads": 2, "head_dim": 32, "mlp_dim": 256, "num_layers": 2,
        "vocab_size": 512}
TINY_RUN = {"seq_len": 64, "batch_size": 2, "warmup_steps": 1, "steps": 2, "windows": 1}
CUDNN_FMHA = "__cudnn$fmha"
ROOT = Path(__file__).resolve().parents[1]
PEER_TIMEOUT_S = 1800


def add_arguments(parser) -> None:
    parser.add_argument("--models", help=f"comma-separated gin/models/*.gin names, e.g. gpt2_125m,gpt2_350m "
                                         f"(default {DEFAULTS['models']})")
    parser.add_argument("--policies", help=f"remat policies to try, in order (default {DEFAULTS['policies']})")
    for key in ("seq_len", "batch_size", "vocab_size", "warmup_steps", "steps", "windows"):
        default = {"seq_len": "the model's max_len", "vocab_size": "the gin file's"}.get(key, DEFAULTS[key])
        parser.add_argument(f"--{key}", type=int, help=f"default {default}")
    parser.add_argument("--peak_flops", type=float,
                        help="peak FLOP/s per device for MFU (default 989e12: H100 SXM bf16 dense; H200 the same)")
    parser.add_argument("--attention", choices=("auto", "xla", "cudnn"),
                        help="DecoderConfig.attention_implementation (default auto: cuDNN on GPUs in bf16)")
    parser.add_argument("--packed_segments", type=int,
                        help="segments packed into each row, with segment ids and positions as pretraining "
                             "feeds them (default 4); 0: one unpacked example per row")
    parser.add_argument("--cudnn_segments", type=int,
                        help="DecoderConfig.cudnn_segments_per_row: packed rows reach cuDNN as segment offsets "
                             "and lengths, up to this many per row (default: the gin file's, None: a dense mask)")
    parser.add_argument("--scan_layers", type=int, choices=(0, 1),
                        help="1: layers stacked by scan, 0: unrolled (default: the gin file's, scanned)")
    parser.add_argument("--scan_unroll", type=int,
                        help="scanned layers per loop iteration; the number of layers or more: no loop "
                             "(default: the gin file's, 1)")
    parser.add_argument("--memory_limit_gib", type=float,
                        help="skip policies whose predicted peak exceeds this (default: the device's limit)")
    parser.add_argument("--allow_cpu", action="store_true", default=None,
                        help="run on CPU with tiny stand-in models (validation only)")
    parser.add_argument("--torch", choices=("auto", "off"),
                        help="auto (default): a PyTorch column where PyTorch is installed; off: none")


def gin_model(name: str):
    import gin

    from t5x_lite.config import parsing

    parsing.parse(gin_files=[f"models/{name}.gin"])
    return gin.query_parameter("%MODEL").scoped_configurable_fn()


def model_config(name: str, policy: str, s: dict, limit: float | None) -> tuple:
    """(the model of gin/models/NAME.gin as measured, its layer layout in words, the row length)."""
    cfg = gin_model(name)
    seq = s["seq_len"] or cfg.max_len
    sizes = dict(TINY) if s["tiny_stand_ins"] else {}
    if s["vocab_size"]:
        sizes["vocab_size"] = s["vocab_size"]
    if s["scan_layers"] is not None:
        sizes["scan_layers"] = bool(s["scan_layers"])
    if s["scan_unroll"] is not None:
        sizes["scan_unroll"] = s["scan_unroll"]
    if s["cudnn_segments"] is not None:
        sizes["cudnn_segments_per_row"] = s["cudnn_segments"]
    cfg = dataclasses.replace(cfg, **sizes, dtype="bfloat16", remat_policy=policy,
                              max_len=max(cfg.max_len, seq), attention_implementation=s["attention"])
    cfg, layers = resolve_layers(cfg, s, seq, limit)
    return cfg, layers, seq


def resolve_layers(cfg, s: dict, seq: int, limit: float | None) -> tuple:
    """`scan_unroll='auto'` resolved as `train` resolves it (startup.resolve_layer_layout) on the mesh
    common.make_trainer builds, for devices of `limit` bytes; and the layout in words."""
    spec = RunSpec(model=cfg, train_data=DataConfig(mixture_or_task_name="gpu_decoders", sequence_length=seq,
                                                    batch_size=s["batch_size"]))
    placement = Placement(mesh=partitioning.make_mesh(), rules=partitioning.DEFAULT_RULES)
    spec, layers = startup.resolve_layer_layout(spec, placement, platform=jax.devices()[0].platform,
                                                device_bytes=int(limit) if limit else None)
    return spec.model, layers


def memory_limit_bytes(s: dict) -> float | None:
    if s["memory_limit_gib"]:
        return s["memory_limit_gib"] * common.GIB
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")


def attempt(name: str, policy: str, s: dict, limit: float | None) -> dict:
    """Compiles and times one (model, policy); raises on failure, returns {'skipped': ...} if too big."""
    cfg, layers, seq = model_config(name, policy, s, limit)
    batch = common.make_batch(cfg, batch=s["batch_size"], length=seq, packed_segments=s["packed_segments"])
    trainer = common.make_trainer(cfg)
    step = common.compile_train_step(trainer, batch)
    mem = trainer_lib.compiled_memory_bytes(step.compiled.memory_analysis())
    predicted = max(mem["total"], mem["xla_peak"])
    if limit and predicted > limit:
        return {"skipped": f"predicted {common.fmt_bytes(predicted)} > limit {common.fmt_bytes(limit)}"}
    # jax lowers implementation='cudnn' to a cuDNN custom call, which XLA then must run.
    text = step.lowered.as_text()
    kernel = "XLA (unfused)"
    if CUDNN_FMHA in text:  # a dense mask reaches cuDNN as a bias: its ScaleBias kernels
        kernel = "cuDNN fused, mask as bias" if CUDNN_FMHA + "ScaleBias" in text else "cuDNN fused"
    state = trainer.init_state(jax.random.PRNGKey(0), batch)
    batch = common.global_batch(trainer, batch)
    rng = trainer.replicated(jax.random.PRNGKey(1))
    state, metrics, _, seconds = common.timed_steps(step.compiled, state, batch, rng, warmup=s["warmup_steps"],
                                                    windows=s["windows"], steps=s["steps"])
    return {"cfg": cfg, "layers": layers, "seq": seq, "compile_s": step.lower_seconds + step.compile_seconds,
            "step_s": statistics.median(seconds), "predicted": predicted, "kernel": kernel,
            "loss": float(metrics["loss_sum"] / metrics["weight_sum"])}


def first_fitting(name: str, s: dict, limit: float | None) -> tuple[dict | None, list[str]]:
    """The result of the first policy that fits, and what happened to each one tried."""
    tried = []
    for policy in common.strs(s["policies"]):
        common.progress(f"gpu_decoders: {name} remat={policy}")
        try:
            result = attempt(name, policy, s, limit)
        except Exception as e:  # noqa: BLE001 - OOM moves on; anything else ends this model's row
            if not common.is_oom(e):
                tried.append(f"{policy}: {common.short_error(e)}")
                return None, tried
            tried.append(f"{policy}: OOM ({common.error_name(e)})")
            result = None
        finally:
            gc.collect()
        if result and "skipped" in result:
            tried.append(f"{policy}: {result['skipped']}")
        elif result:
            tried.append(f"{policy}: ok")
            return {**result, "policy": policy}, tried
    return None, tried


def torch_column(s: dict) -> str | None:
    """Why there is no PyTorch column (None: there is one)."""
    if s["torch"] == "off":
        return "--torch off"
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed (`make install-torch`; a CUDA build of it for GPUs)"
    return None


def torch_peer(cfg, s: dict, seq: int) -> dict:
    """The PyTorch peer of `cfg` trained at the same batch and length (torch_reference.peer_measure) in
    a process of its own: its result, or {'error': ...}."""
    settings = {"batch_size": s["batch_size"], "seq_len": seq, "warmup_steps": s["warmup_steps"], "steps": s["steps"],
                "windows": s["windows"], "device": "cpu" if s["tiny_stand_ins"] else "cuda",
                "compile": not s["tiny_stand_ins"], "learning_rate": 1e-4, "weight_decay": 0.01, "seed": 0}
    request = json.dumps({"model": cfg.metadata()["model"], "settings": settings})
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # the child never starts JAX on the GPU
    try:
        proc = subprocess.run([sys.executable, "-m", "bench.torch_reference", request], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=PEER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {PEER_TIMEOUT_S} s"}
    results = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not results:
        return {"error": f"exit {proc.returncode}: {' '.join(proc.stderr.split())[-300:]}"}
    return json.loads(results[-1])


def peer_note(name: str, peer: dict) -> str:
    if "error" in peer:
        return f"- {name} PyTorch: {'OOM: ' if peer.get('oom') else ''}{peer['error']}"
    return (f"- {name} PyTorch: {peer['peer']}, {'torch.compile' if peer['compiled'] else 'eager'}, bf16 autocast, "
            f"{'fused ' if peer['fused_adamw'] else ''}AdamW; torch {peer['torch']} on {peer['device']}; "
            f"1st step {peer['first_step_s']:.1f} s, step {peer['step_s'] * 1e3:,.1f} ms (median), loss "
            f"{peer['first_loss']:.3f} -> {peer['loss']:.3f}; {peer['params']:,} params, {peer['matmul_params']:,} "
            "in matmuls (t5x_lite's count)")


def run(args, command: str) -> None:
    s = common.resolve(args, DEFAULTS, QUICK)
    no_torch = torch_column(s)
    if no_torch is None:  # before JAX's backends start: leave the PyTorch processes what JAX's steps do not use
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    device = jax.devices()[0]
    if device.platform == "cpu":
        if not s["allow_cpu"]:
            raise SystemExit(f"gpu_decoders measures GPU training, but JAX sees only {common.accelerator()}. "
                             "Run it on a GPU machine, or add --allow_cpu to validate the script with tiny "
                             "stand-in models.")
        s.update({k: getattr(args, k) if getattr(args, k) is not None else v for k, v in TINY_RUN.items()})
    s["tiny_stand_ins"] = device.platform == "cpu"
    limit = memory_limit_bytes(s)
    rows, notes = [], []
    for name in common.strs(s["models"]):
        r, tried = first_fitting(name, s, limit)
        notes.append(f"- {name}: " + "; ".join(tried) + (f"; layers: {r['layers']}" if r else ""))
        if r is None:
            rows.append([name, *["-"] * 4, s["batch_size"], s["seq_len"] or "-", *["-"] * 10])
            continue
        peer = {}
        if no_torch is None:
            peer = {"error": "no PyTorch peer for this model's options"}
            if torch_reference.peer_style(r["cfg"].to_dict()) is not None:
                common.progress(f"gpu_decoders: {name} PyTorch")
                peer = torch_peer(r["cfg"], s, r["seq"])
            notes.append(peer_note(name, peer))
        tokens = s["batch_size"] * r["seq"]
        rate = tokens / r["step_s"]
        flops = common.flops_per_token(r["cfg"], r["seq"])
        peer_rate = peer.get("tokens_per_s")
        rows.append([name, f"{r['cfg'].num_params() / 1e6:,.1f}M", r["policy"], r["layers"].split(" (")[0],
                     f"{len(tried)}", s["batch_size"], r["seq"], f"{r['compile_s']:.1f}",
                     f"{r['step_s'] * 1e3:,.1f}", f"{rate:,.0f}", f"{peer_rate:,.0f}" if peer_rate else "-",
                     f"{rate / peer_rate:.2f}x" if peer_rate else "-",
                     f"{100 * common.mfu(flops, rate, s['peak_flops']):.1f}%", f"{flops / 1e9:.3f}",
                     common.fmt_bytes(r["predicted"]), r["kernel"], f"{r['loss']:.3f}"])
    print(common.header(command))
    print()
    if s["tiny_stand_ins"]:
        print(f"**CPU validation run: every model is shrunk to {TINY}; the figures say nothing about the "
              "real models.**\n")
    print(common.table(["model", "params", "remat used", "layers", "policies tried", "batch", "seq",
                        "lower+compile s", "step ms (median)", "tokens/s", "PyTorch tokens/s", "JAX / PyTorch", "MFU",
                        "GFLOP/token", "predicted memory", "attention kernel", "loss"], rows))
    print()
    limit_text = common.fmt_bytes(limit) if limit else "unknown"
    print(f"bfloat16 compute, float32 params, AdamW, scan_layers and scan_unroll from the gin "
          "file unless given ('auto' resolved as `train` resolves it: the layers column); "
          f"MFU = flops_per_token x tokens/s / ({s['peak_flops']:.3g} x {jax.device_count()} devices); "
          f"device memory limit {limit_text}. PyTorch: "
          + (no_torch if no_torch else
             "each model's peer in its own process right after its JAX row, the same batch, length, warm-up and "
             "windows, plain causal rows"
             + (f" (the JAX rows pack {s['packed_segments']} segments per row: --packed_segments=0 trains the "
                "same rows on both sides)" if s["packed_segments"] else ""))
          + ". Per model, policies tried and the PyTorch peer:")
    print("\n".join(notes))
    print(common.settings_line(s))
