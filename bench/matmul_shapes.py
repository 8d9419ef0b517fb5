"""matmul_shapes: the train step's dense matmuls, each timed alone, in JAX and in eager PyTorch.

The llama-style decoder that `throughput` (t5x_lite) and `torch_reference` (eager PyTorch)
train, at their sizes (--vocab_size: 4,096, the prepared corpus's, as `loop_overhead` trains).
Each framework's step runs the same dense matmuls in its own layout: three per projection
(forward, input gradient, kernel gradient), for q, k, v and the attention output, SwiGLU's gate,
up and down, per layer, and the logits once. t5x_lite keeps kernels [in, out] and projects q, k
and v separately (`models/projection.py`: x @ W, g @ W^T, x^T @ g); PyTorch's nn.Linear keeps
weights [out, in] with one q/k/v projection, and autograd calls x @ W^T, g @ W, g^T @ x.

Each distinct problem is timed on its own: JAX as a jitted `lax.dot_general` with those
dimension numbers, PyTorch as `torch.matmul` on transposed views, float32, the best of
--repeats windows of back-to-back calls (PyTorch on --threads threads, default: the usable
cores). Inside the compiled step XLA:CPU may instead copy a transposed operand into place
(fused into the op that produces it) and run the 'nn' kernel: it does so for every kernel
gradient of this model. So a JAX problem in 'nt' or 'tn' is also timed with its transposed
operand stored transposed ('nn'), and the faster of the two counts (the copy is left to the
rest of the step); each distinct kernel (layout and sizes) is timed once. A problem's time
times its count per step, summed, is what the framework's matmul kernels alone need for one
step. Next to the step times of `loop_overhead` and `torch_reference` in the same sitting,
that splits the gap between the two steps into the kernels' share and the rest. Attention's
score products are left out: PyTorch runs them inside its fused scaled_dot_product_attention
kernel, t5x_lite as batched matmuls (`models/explicit_attention.py`); the table's last line says
what share of the step's FLOPs the dense matmuls are. Needs PyTorch (`make install-torch`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bench import common, throughput, torch_reference

SIZES = ("emb_dim", "num_layers", "num_heads", "head_dim", "mlp_dim", "vocab_size", "seq_len", "batch_size")
DEFAULTS = {**{key: throughput.DEFAULTS[key] for key in SIZES}, "vocab_size": 4096, "repeats": 5,
            "min_window_s": 0.2, "threads": None}
QUICK = {**{key: throughput.QUICK[key] for key in SIZES}, "repeats": 2, "min_window_s": 0.01}

# A @ B with A [m, k] and B [k, n] ('nn'), A [m, k] and B [n, k] ('nt': B transposed), or A [k, m]
# and B [k, n] ('tn': A transposed); the contracted dimensions as lax.dot_general takes them.
CONTRACTING = {"nn": ((1,), (0,)), "nt": ((1,), (1,)), "tn": ((0,), (0,))}


class Problem(NamedTuple):
    """One matmul of the step: `count` per step of A @ B, m x k by k x n, in `layout`."""
    name: str
    layout: str
    m: int
    k: int
    n: int
    count: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n


def projections(s: dict, *, fused_qkv: bool) -> list[tuple[str, int, int, int]]:
    """(name, in, out, per step) of every dense projection of the decoder: per layer, then the logits."""
    d, q, layers = s["emb_dim"], s["num_heads"] * s["head_dim"], s["num_layers"]
    attention = [("qkv", d, 3 * q, layers)] if fused_qkv else [("q", d, q, layers), ("k", d, q, layers),
                                                                ("v", d, q, layers)]
    return [*attention, ("attention out", q, d, layers), ("mlp gate", d, s["mlp_dim"], layers),
            ("mlp up", d, s["mlp_dim"], layers), ("mlp down", s["mlp_dim"], d, layers),
            ("logits", d, s["vocab_size"], 1)]


def step_problems(s: dict, framework: str) -> list[Problem]:
    """The dense matmuls of one train step as `framework` ('jax': t5x_lite, 'torch': eager PyTorch) runs them."""
    tokens = s["batch_size"] * s["seq_len"]
    problems = []
    for name, d_in, d_out, count in projections(s, fused_qkv=framework == "torch"):
        if framework == "jax":  # kernel [in, out]: x @ W, g @ W^T, x^T @ g
            problems += [Problem(f"{name} forward", "nn", tokens, d_in, d_out, count),
                         Problem(f"{name} input grad", "nt", tokens, d_out, d_in, count),
                         Problem(f"{name} kernel grad", "tn", d_in, tokens, d_out, count)]
        else:  # weight [out, in]: x @ W^T, g @ W, g^T @ x
            problems += [Problem(f"{name} forward", "nt", tokens, d_in, d_out, count),
                         Problem(f"{name} input grad", "nn", tokens, d_out, d_in, count),
                         Problem(f"{name} kernel grad", "tn", d_out, tokens, d_in, count)]
    return problems


def operand_shapes(p: Problem) -> tuple[tuple[int, int], tuple[int, int]]:
    a = (p.k, p.m) if p.layout == "tn" else (p.m, p.k)
    b = (p.n, p.k) if p.layout == "nt" else (p.k, p.n)
    return a, b


def jax_seconds(p: Problem, *, repeats: int, min_window_s: float) -> float:
    """Dispatched back to back and waited for together, as matmul_peak times its matmuls."""
    a_shape, b_shape = operand_shapes(p)
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal(a_shape, np.float32))
    b = jnp.asarray(rng.standard_normal(b_shape, np.float32))
    matmul = jax.jit(lambda a, b: jax.lax.dot_general(a, b, (CONTRACTING[p.layout], ((), ()))))
    assert matmul(a, b).shape == (p.m, p.n)
    return common.best_seconds(lambda calls: jax.block_until_ready([matmul(a, b) for _ in range(calls)]),
                        repeats=repeats, min_window_s=min_window_s)


def torch_seconds(p: Problem, *, repeats: int, min_window_s: float) -> float:
    torch = torch_reference.import_torch()
    a_shape, b_shape = operand_shapes(p)
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(a_shape, generator=generator), torch.randn(b_shape, generator=generator)
    matmul = {"nn": lambda: a @ b, "nt": lambda: a @ b.t(), "tn": lambda: a.t() @ b}[p.layout]
    assert tuple(matmul().shape) == (p.m, p.n)

    def run_calls(calls: int) -> None:
        for _ in range(calls):
            matmul()

    return common.best_seconds(run_calls, repeats=repeats, min_window_s=min_window_s)


def time_problems(problems: list[Problem], timer: Callable[..., float], *, also_nn: bool, repeats: int,
                  min_window_s: float) -> list[tuple[Problem, float, str]]:
    """(problem, seconds per call, the layout that gave them) for each problem: its own layout or,
    with `also_nn`, the faster of that and 'nn'. Each distinct kernel (layout, m, k, n) is timed once."""
    seconds = {}

    def timed(p: Problem, layout: str) -> tuple[float, str]:
        key = (layout, p.m, p.k, p.n)
        if key not in seconds:
            common.progress(f"{layout} {p.m}x{p.k}x{p.n}")
            seconds[key] = timer(p._replace(layout=layout), repeats=repeats, min_window_s=min_window_s)
        return seconds[key], layout

    extra = ("nn",) if also_nn else ()
    return [(p, *min(timed(p, layout) for layout in dict.fromkeys((p.layout, *extra)))) for p in problems]


def measure(s: dict) -> dict:
    """Per framework: rows (problem, seconds per call, the layout timed) and the step's total matmul seconds."""
    torch = torch_reference.import_torch()
    torch.set_num_threads(s["threads"])
    timers = {"jax": jax_seconds, "torch": torch_seconds}
    results = {}
    for framework, timer in timers.items():
        problems = step_problems(s, framework)
        # A process's first timing runs slower (a quarter slower in one check): one untimed round first.
        timer(problems[0], repeats=1, min_window_s=s["min_window_s"])
        common.progress(framework)
        rows = time_problems(problems, timer, also_nn=framework == "jax", repeats=s["repeats"],
                             min_window_s=s["min_window_s"])
        results[framework] = {"rows": rows, "total_s": sum(p.count * t for p, t, _ in rows),
                              "flops": sum(p.count * p.flops for p, _, _ in rows)}
    return results


def run(args, command: str) -> dict:
    s = common.resolve(args, DEFAULTS, QUICK)
    s["threads"] = s["threads"] or common.usable_cores()
    torch = torch_reference.import_torch()
    print(common.header(command))
    r = measure(s)
    table = []
    for framework, label in (("jax", "JAX (t5x_lite)"), ("torch", f"PyTorch {torch.__version__}")):
        for p, t, layout in r[framework]["rows"]:
            table.append([label, p.name, f"{p.layout} {p.m}x{p.k}x{p.n}", layout, p.count,
                          f"{p.flops / t / 1e9:,.1f}", f"{1e3 * p.count * t:,.2f}"])
    print(common.table(["framework", "matmul", "layout m x k x n", "timed as", "per step", "GFLOP/s", "ms per step"],
                       table))
    cfg = throughput.model_config("llama", "float32", s)
    step_flops = common.flops_per_token(cfg, s["seq_len"]) * s["batch_size"] * s["seq_len"]
    jax_ms, torch_ms = 1e3 * r["jax"]["total_s"], 1e3 * r["torch"]["total_s"]
    print(f"\nThe step's dense matmuls alone, per step: JAX {jax_ms:,.1f} ms "
          f"({r['jax']['flops'] / r['jax']['total_s'] / 1e9:,.1f} GFLOP/s), PyTorch {torch_ms:,.1f} ms "
          f"({r['torch']['flops'] / r['torch']['total_s'] / 1e9:,.1f} GFLOP/s): PyTorch's kernels "
          f"{jax_ms / torch_ms:.2f}x as fast. They are {100 * r['jax']['flops'] / step_flops:.1f}% of the "
          f"step's {step_flops / 1e9:,.1f} GFLOP (t5x_lite's formula; the rest is attention).")
    print(common.settings_line(s))
    return {"jax_ms": jax_ms, "torch_ms": torch_ms}


def add_arguments(parser) -> None:
    for key in (*SIZES, "repeats"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]}")
    parser.add_argument("--min_window_s", type=float,
                        help=f"shortest timed window, seconds (default {DEFAULTS['min_window_s']})")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: the usable cores)")
