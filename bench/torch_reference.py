"""torch_reference: training tokens/s of an eager PyTorch decoder on CPU, next to `throughput`.

A plain nanoGPT-style decoder, written in this module in PyTorch (no model library): token
embedding, --num_layers pre-norm blocks of causal multi-head self-attention
(F.scaled_dot_product_attention, is_causal=True) and an MLP, a final norm, an untied output
projection to the vocabulary and cross-entropy. --style llama: RMSNorm, RoPE, SwiGLU MLP of
--mlp_dim, no biases; --style gpt2: LayerNorm, learned positions, GELU (tanh) MLP of
4 x emb_dim, biases. Sizes default to `throughput`'s. It trains in eager mode, float32, with
torch.optim.AdamW (lr 1e-4, weight decay 0.01, torch's default implementation) on one fixed
batch of random tokens, with torch.set_num_threads(--threads, default: the usable cores).
Timing as `throughput`'s: --warmup_steps untimed steps, then --windows windows of --steps
steps; seconds/step median and best; tokens/s = batch x seq_len / step. MFLOP/token is
t5x_lite's own formula for the equivalent t5x_lite config (`throughput.model_config`), so MFU
(over the measured JAX float32 matmul peak, or --peak_flops) compares with `throughput`'s. The
run stops if the PyTorch model's matmul parameters (all but the lookup tables) differ from that
config's. Needs PyTorch (`make install-torch`).

`python -m bench.torch_reference REQUEST` is gpu_decoders' PyTorch column: the peer of one
t5x_lite decoder (`peer_style`: the gpt2 style here with tied embeddings, or transformers'
LlamaForCausalLM) trained with torch.compile, bfloat16 autocast and fused AdamW on CUDA
(`peer_measure`), one JSON line out.
"""

from __future__ import annotations

import math
import statistics
import time

from bench import common, throughput

SIZES = ("emb_dim", "num_layers", "num_heads", "head_dim", "mlp_dim", "vocab_size", "seq_len", "batch_size")
STYLES = ("llama", "gpt2")
DEFAULTS = {"style": "llama", **{key: throughput.DEFAULTS[key] for key in SIZES}, "warmup_steps": 2, "steps": 5,
            "windows": 3, "threads": None, "learning_rate": 1e-4, "weight_decay": 0.01, "seed": 0,
            "peak_flops": None}
QUICK = {key: throughput.QUICK[key] for key in (*SIZES, "warmup_steps", "steps", "windows")}

INSTALL_HINT = ("torch_reference needs PyTorch, which this Python cannot import: run `make install-torch` "
                "(installs requirements/torch.txt into the venv).")


def add_arguments(parser) -> None:
    parser.add_argument("--style", choices=STYLES, help=f"model style (default {DEFAULTS['style']})")
    for key in (*SIZES, "warmup_steps", "steps", "windows", "seed"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]}")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: the usable cores)")
    parser.add_argument("--learning_rate", type=float, help=f"AdamW lr (default {DEFAULTS['learning_rate']})")
    parser.add_argument("--weight_decay", type=float, help=f"AdamW weight decay (default {DEFAULTS['weight_decay']})")
    parser.add_argument("--peak_flops", type=float, help="float32 peak FLOP/s for MFU (default: measure)")


def import_torch():
    """The torch module, or SystemExit with one line on how to install it."""
    try:
        import torch
    except ImportError:
        raise SystemExit(INSTALL_HINT) from None
    return torch


# ---------------------------------------------------------------------------- the model


def build_model(style: str, s: dict, *, tie_embeddings: bool = False):
    """The PyTorch decoder of `style` at the sizes in `s`: a torch.nn.Module mapping tokens
    [batch, length] to logits [batch, length, vocab]. Its `lookup_tables` are the embedding
    tables (read by index, not multiplied); every other parameter counts as a matmul one.
    `tie_embeddings`: the output projection is the token embedding (nanoGPT's, and t5x_lite's
    gpt2), which then counts as a matmul parameter, once. The learned position table (gpt2)
    has s['max_len'] rows when given, else s['seq_len']."""
    torch = import_torch()
    from torch import nn
    from torch.nn import functional as F

    if style not in STYLES:
        raise ValueError(f"Unknown style {style!r}; choose from {', '.join(STYLES)}.")
    llama = style == "llama"
    d, heads, head_dim, vocab, length = s["emb_dim"], s["num_heads"], s["head_dim"], s["vocab_size"], s["seq_len"]
    mlp_dim = s["mlp_dim"] if llama else 4 * d
    bias = not llama

    def norm():
        return nn.RMSNorm(d, eps=1e-6) if llama else nn.LayerNorm(d, eps=1e-5)

    class RoPE(nn.Module):
        """Rotary position embedding of x [batch, length, heads, head_dim], halves rotated (as t5x_lite's)."""

        def __init__(self, max_wavelength: float = 10_000.0):
            super().__init__()
            half = head_dim // 2
            inv_freq = 1.0 / max_wavelength ** (torch.arange(half, dtype=torch.float32) / half)
            angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)  # [length, half]
            self.register_buffer("cos", angles.cos()[:, None, :], persistent=False)
            self.register_buffer("sin", angles.sin()[:, None, :], persistent=False)

        def forward(self, x):
            n = x.shape[1]
            cos, sin = self.cos[:n], self.sin[:n]
            x1, x2 = x.chunk(2, dim=-1)
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * heads * head_dim, bias=bias)
            self.out = nn.Linear(heads * head_dim, d, bias=bias)
            self.rope = RoPE() if llama else None

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, heads, head_dim).unbind(dim=2)  # each [b, n, heads, head_dim]
            if self.rope is not None:
                q, k = self.rope(q), self.rope(k)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)  # [b, heads, n, head_dim]
            return self.out(y.transpose(1, 2).reshape(b, n, heads * head_dim))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            if llama:  # SwiGLU: down(silu(gate(x)) * up(x))
                self.gate = nn.Linear(d, mlp_dim, bias=False)
            self.up = nn.Linear(d, mlp_dim, bias=bias)
            self.down = nn.Linear(mlp_dim, d, bias=bias)

        def forward(self, x):
            if llama:
                return self.down(F.silu(self.gate(x)) * self.up(x))
            return self.down(F.gelu(self.up(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.attention = norm(), Attention()
            self.mlp_norm, self.mlp = norm(), MLP()

        def forward(self, x):
            x = x + self.attention(self.attention_norm(x))
            return x + self.mlp(self.mlp_norm(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.token_embedding = nn.Embedding(vocab, d)
            self.position_embedding = None if llama else nn.Embedding(s.get("max_len") or length, d)
            self.blocks = nn.ModuleList(Block() for _ in range(s["num_layers"]))
            self.final_norm = norm()
            self.output = nn.Linear(d, vocab, bias=False)
            self.apply(self._init)
            if tie_embeddings:
                self.output.weight = self.token_embedding.weight

        @staticmethod
        def _init(module):
            if isinstance(module, (nn.Linear, nn.Embedding)):  # GPT-2 / nanoGPT initialisation
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

        @property
        def lookup_tables(self):
            tables = [self.position_embedding] + ([] if tie_embeddings else [self.token_embedding])
            return [m.weight for m in tables if m is not None]

        def forward(self, tokens):
            x = self.token_embedding(tokens)
            if self.position_embedding is not None:
                x = x + self.position_embedding(torch.arange(tokens.shape[1], device=tokens.device))
            for block in self.blocks:
                x = block(x)
            return self.output(self.final_norm(x))

    return Decoder()


# ---------------------------------------------------------------------------- parameter counts


def torch_param_counts(model) -> tuple[int, int]:
    """(all parameters, matmul parameters: all but the embedding lookup tables)."""
    total = sum(p.numel() for p in model.parameters())
    return total, total - sum(p.numel() for p in model.lookup_tables)


def library_matmul_params(cfg) -> int:
    """The parameter count behind t5x_lite's 6 x params FLOPs term (DecoderConfig.flops_per_token):
    everything but the lookup tables, the output projection counted once even when tied."""
    tied_output = cfg.vocab_size * cfg.emb_dim if cfg.tie_embeddings else 0
    return cfg.num_params() - cfg.num_embedding_params() + tied_output


# ---------------------------------------------------------------------------- measurement


def timed_training(step, s: dict, sync=None) -> dict:
    """`step()` (one training step, returning its loss) timed as common.timed_steps times t5x_lite's:
    s['warmup_steps'] untimed steps (the first timed alone: compilation, with torch.compile), then
    s['windows'] windows of s['steps'] steps, `sync()` (the device's, when asynchronous) ending each.
    Returns the first step's seconds and loss, the seconds per step of each window and the last loss."""
    sync = sync or (lambda: None)
    start, first_s, first_loss = time.perf_counter(), None, None
    for _ in range(s["warmup_steps"]):
        loss = step()
        sync()
        if first_s is None:
            first_s, first_loss = time.perf_counter() - start, float(loss)
    per_step = []
    for _ in range(s["windows"]):
        start = time.perf_counter()
        for _ in range(s["steps"]):
            loss = step()
        sync()
        per_step.append((time.perf_counter() - start) / s["steps"])
    return {"first_step_s": first_s, "first_loss": first_loss, "per_step": per_step, "loss": float(loss)}


def measure(style: str, s: dict) -> dict:
    """Trains the PyTorch model on one fixed random batch, timed as common.timed_steps times t5x_lite."""
    torch = import_torch()
    from torch.nn import functional as F

    torch.set_num_threads(s["threads"] or common.usable_cores())
    cfg = throughput.model_config(style, "float32", s)
    torch.manual_seed(s["seed"])
    model = build_model(style, s)
    params, matmul_params = torch_param_counts(model)
    if matmul_params != library_matmul_params(cfg):
        raise SystemExit(f"torch_reference: the PyTorch {style} model has {matmul_params:,} matmul parameters, "
                         f"the equivalent t5x_lite config {library_matmul_params(cfg):,} "
                         f"(cfg.num_params() = {cfg.num_params():,}); MFLOP/token and MFU would not be like for like.")
    optimizer = torch.optim.AdamW(model.parameters(), lr=s["learning_rate"], weight_decay=s["weight_decay"])
    generator = torch.Generator().manual_seed(s["seed"])
    tokens = torch.randint(1, s["vocab_size"], (s["batch_size"], s["seq_len"] + 1), generator=generator)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, s["vocab_size"]), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.detach()

    model.train()
    timing = timed_training(step, s)
    first_s, first_loss, per_step, last_loss = (timing[k] for k in ("first_step_s", "first_loss", "per_step", "loss"))

    tokens_per_step = s["batch_size"] * s["seq_len"]
    step_s = statistics.median(per_step)
    return {"cfg": cfg, "params": params, "matmul_params": matmul_params, "threads": torch.get_num_threads(),
            "first_step_s": first_s, "step_s": step_s, "best_step_s": min(per_step), "tokens": tokens_per_step,
            "tokens_per_s": tokens_per_step / step_s, "best_tokens_per_s": tokens_per_step / min(per_step),
            "flops_token": common.flops_per_token(cfg, s["seq_len"]), "first_loss": first_loss,
            "loss": last_loss, "optimizer": type(optimizer).__name__, "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def peak(s: dict, quick: bool) -> tuple[float, str]:
    """JAX's float32 peak FLOP/s and where it came from (`throughput.peaks` for float32 alone)."""
    given = {"peak_flops": s["peak_flops"], "peak_flops_bf16": None, "dtypes": "float32"}
    found, source = throughput.peaks(given, quick)
    return found["float32"], source


def torch_matmul_peak(sizes: tuple[int, ...], threads: int, repeats: int = 5) -> tuple[float, int]:
    """PyTorch's own float32 n x n matmul GFLOP/s (best of `repeats` after 2 warm-ups) and its size:
    the kernel PyTorch's step runs on, next to JAX's in matmul_peak."""
    torch = import_torch()
    torch.set_num_threads(threads)
    best = (0.0, 0)
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        for _ in range(2):
            a @ b
        seconds = min(common.timed(lambda: a @ b)[1] for _ in range(repeats))
        best = max(best, (2 * n**3 / seconds, n))
    return best


def run(args, command: str) -> None:
    s = common.resolve(args, DEFAULTS, QUICK)
    import_torch()  # before anything slow: a missing torch is one line
    s["threads"] = s["threads"] or common.usable_cores()
    if s["warmup_steps"] < 1 or s["steps"] < 1 or s["windows"] < 1:
        raise SystemExit("--warmup_steps, --steps and --windows must each be at least 1.")
    peak_flops, peak_source = peak(s, args.quick)
    peak_source = getattr(args, "peak_source", peak_source)
    common.progress(f"torch_reference: {s['style']} float32")
    r = measure(s["style"], s)
    cfg = r["cfg"]
    mfu = r["flops_token"] * r["tokens_per_s"] / peak_flops  # one CPU, as throughput's single device
    torch_peak, torch_n = torch_matmul_peak((256, 512) if args.quick else (1024, 2048, 4096), r["threads"])
    fell = r["loss"] < r["first_loss"]
    row = [s["style"], "float32", r["threads"], f"{r['params']:,}", f"{cfg.num_params():,}",
           f"{r['matmul_params']:,}", r["tokens"], f"{r['flops_token'] / 1e6:,.1f}", f"{r['first_step_s']:.2f}",
           f"{r['step_s'] * 1e3:,.1f}", f"{r['tokens_per_s']:,.0f}", f"{r['best_tokens_per_s']:,.0f}",
           f"{100 * mfu:.1f}%", f"{peak_flops / 1e9:,.1f}", f"{r['first_loss']:.3f}", f"{r['loss']:.3f}"]

    print(common.header(command))
    print()
    print(common.table(["style", "dtype", "threads", "params (torch)", "params (t5x_lite cfg)", "matmul params",
                        "tokens/step", "MFLOP/token", "1st step s", "step ms (median)", "tokens/s (median)",
                        "tokens/s (best)", "MFU (median)", "peak GFLOP/s", "loss (1st step)", "loss (last)"], [row]))
    print()
    print(f"Eager PyTorch {r['torch']} on CPU ({r['threads']} threads, torch.get_num_threads(); CPU capability "
          f"{r['cpu_capability']}), {r['optimizer']} with torch's default implementation. "
          f"Loss fell from the first step: {'yes' if fell else 'NO'} ({r['first_loss']:.4f} -> {r['loss']:.4f}; "
          f"ln(vocab) = {math.log(s['vocab_size']):.3f}). MFLOP/token and the matmul parameter count are "
          f"t5x_lite's for throughput.model_config({s['style']!r}, 'float32'); they equal the PyTorch model's."
          + (" params differ by the untied input table: t5x_lite's gpt2 config ties the output projection to the "
             "embedding." if r["params"] != cfg.num_params() else "")
          + f" MFU peak (JAX's float32 matmul): {peak_source}. PyTorch's own float32 matmul peaks at "
          f"{torch_peak / 1e9:,.1f} GFLOP/s "
          f"(n = {torch_n}, {r['threads']} threads), {torch_peak / peak_flops:.2f}x that peak; against it this step's "
          f"MFU is {100 * r['flops_token'] * r['tokens_per_s'] / torch_peak:.1f}%. Rows are plain causal sequences "
          "(throughput packs --packed_segments per row unless given --packed_segments=0).")
    print(common.settings_line(s))


# ---------------------------------------------------------------------------- gpu_decoders' PyTorch column
#
# `python -m bench.torch_reference REQUEST` (REQUEST: JSON {"model": a t5x_lite DecoderConfig's fields,
# "settings": ...}) trains the PyTorch peer of that config and prints one JSON line. gpu_decoders starts it
# once per model, in a process of its own: PyTorch's CUDA libraries never meet JAX's, and its memory is
# returned when it ends.

PEERS = {"gpt2": "nanoGPT-style GPT-2 (this module's gpt2 style, tied embeddings)",
         "llama": "transformers LlamaForCausalLM (sdpa attention)"}


def peer_style(cfg: dict) -> str | None:
    """The PyTorch peer of a t5x_lite DecoderConfig (its fields): 'gpt2' for GPT-2 style (learned
    positions, LayerNorm, GELU MLP of 4 x emb_dim, biases, tied embeddings, multi-head attention),
    'llama' for LLaMA style (RoPE, RMSNorm, SwiGLU, no biases, untied); None for anything else
    (a sliding window, q/k/v biases, scaled embeddings, ...), which has no peer here."""
    if cfg.get("sliding_window") or cfg.get("qkv_bias") or cfg.get("scale_embeddings"):
        return None
    shape = (cfg["position_embedding"], cfg["norm"], tuple(cfg["mlp_activations"]), cfg["use_bias"],
             cfg["tie_embeddings"])
    if (shape == ("learned", "layernorm", ("gelu",), True, True) and cfg["num_kv_heads"] == cfg["num_heads"]
            and cfg["mlp_dim"] == 4 * cfg["emb_dim"]):
        return "gpt2"
    if shape == ("rope", "rmsnorm", ("silu", "linear"), False, False):
        return "llama"
    return None


def llama_model(cfg: dict):
    """transformers' LlamaForCausalLM with the config's sizes, sdpa attention, and its embedding as
    `lookup_tables` (as build_model's models)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=cfg["vocab_size"], hidden_size=cfg["emb_dim"], intermediate_size=cfg["mlp_dim"],
                         num_hidden_layers=cfg["num_layers"], num_attention_heads=cfg["num_heads"],
                         num_key_value_heads=cfg["num_kv_heads"], head_dim=cfg["head_dim"],
                         max_position_embeddings=cfg["max_len"], rms_norm_eps=cfg.get("norm_epsilon") or 1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_max_wavelength"]},
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False, use_cache=False,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    model.lookup_tables = [model.model.embed_tokens.weight]
    return model


def peer_measure(cfg: dict, s: dict) -> dict:
    """Trains the PyTorch peer of the t5x_lite DecoderConfig `cfg` (its fields) on one fixed random
    batch of s['batch_size'] x s['seq_len'] plain causal rows on s['device'] ('cuda' or 'cpu'):
    float32 parameters, bfloat16 autocast, AdamW (fused on CUDA), torch.compile when s['compile'];
    timed by `timed_training`. Stops (SystemExit) when its matmul parameters are not the config's."""
    torch = import_torch()
    from torch.nn import functional as F

    from t5x_lite.models import DecoderConfig

    style, device = peer_style(cfg), s["device"]
    if style is None:
        raise SystemExit("no PyTorch peer for this model's options (peer_style)")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"PyTorch {torch.__version__} sees no CUDA device")
    torch.manual_seed(s["seed"])
    if style == "gpt2":
        sizes = {**{k: cfg[k] for k in ("emb_dim", "num_heads", "head_dim", "vocab_size", "num_layers", "max_len")},
                 "seq_len": s["seq_len"]}
        model = build_model("gpt2", sizes, tie_embeddings=True)
    else:
        model = llama_model(cfg)
    params, matmul_params = torch_param_counts(model)
    library = library_matmul_params(DecoderConfig(**cfg))
    if matmul_params != library:
        raise SystemExit(f"the PyTorch {style} model has {matmul_params:,} matmul parameters, t5x_lite's {library:,}")
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=s["learning_rate"], weight_decay=s["weight_decay"],
                                  fused=device == "cuda")
    forward = torch.compile(model) if s["compile"] else model
    generator = torch.Generator().manual_seed(s["seed"])
    tokens = torch.randint(1, cfg["vocab_size"], (s["batch_size"], s["seq_len"] + 1), generator=generator).to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            logits = forward(inputs)
        logits = getattr(logits, "logits", logits)  # transformers returns an output object
        loss = F.cross_entropy(logits.float().reshape(-1, cfg["vocab_size"]), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.detach()

    timing = timed_training(step, s, sync=torch.cuda.synchronize if device == "cuda" else None)
    step_s = statistics.median(timing["per_step"])
    return {"style": style, "peer": PEERS[style], "params": params, "matmul_params": matmul_params,
            "first_step_s": timing["first_step_s"], "step_s": step_s,
            "tokens_per_s": s["batch_size"] * s["seq_len"] / step_s, "first_loss": timing["first_loss"],
            "loss": timing["loss"], "torch": torch.__version__, "compiled": bool(s["compile"]),
            "fused_adamw": device == "cuda",
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}


def peer_main(argv: list[str]) -> None:
    """The child process: one JSON line, the result or {'error': ..., 'oom': ...}."""
    import json

    request = json.loads(argv[0])
    try:
        result = peer_measure(request["model"], request["settings"])
    except (Exception, SystemExit) as e:  # noqa: BLE001 - reported to the parent, which prints it
        result = {"error": str(e) if isinstance(e, SystemExit) else common.short_error(e), "oom": common.is_oom(e)}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    import sys

    peer_main(sys.argv[1:])
