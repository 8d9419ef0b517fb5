"""matmul_peak: the measured peak FLOP/s of this device, from jitted square matmuls.

For each size n and dtype, `jax.jit(jnp.matmul)` on two n x n arrays is compiled and run once
(warm-up), then timed over several windows of back-to-back calls, each window ending with
block_until_ready on every output; a window lasts at least --min_window_s so dispatch overhead
is negligible on fast devices. GFLOP/s = 2 n^3 / (best window time / calls). The peak used
for MFU by the other benchmarks is the best size of each dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bench import common

DEFAULTS = {"sizes": "1024,2048,3072,4096", "dtypes": "float32,bfloat16", "repeats": 5, "min_window_s": 0.5}
QUICK = {"sizes": "256,512", "repeats": 2, "min_window_s": 0.05}


def add_arguments(parser) -> None:
    parser.add_argument("--sizes", help=f"comma-separated n (default {DEFAULTS['sizes']})")
    parser.add_argument("--dtypes", help=f"comma-separated dtypes (default {DEFAULTS['dtypes']})")
    parser.add_argument("--repeats", type=int, help="timed windows per size; the best is kept")
    parser.add_argument("--min_window_s", type=float, help="shortest timed window, seconds")


def gflops(n: int, dtype: str, *, repeats: int, min_window_s: float) -> float:
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(ka, (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(kb, (n, n), jnp.float32).astype(dtype)
    matmul = jax.jit(jnp.matmul)
    best = common.best_seconds(lambda calls: jax.block_until_ready([matmul(a, b) for _ in range(calls)]),
                               repeats=repeats, min_window_s=min_window_s)
    return 2 * n**3 / best / 1e9


def measure(settings: dict) -> tuple[list[list], dict[str, float]]:
    """Table rows and {dtype: peak FLOP/s}."""
    rows, peaks = [], {}
    for dtype in common.strs(settings["dtypes"]):
        for n in common.ints(settings["sizes"]):
            common.progress(f"matmul {dtype} {n}x{n}")
            rate = gflops(n, dtype, repeats=settings["repeats"], min_window_s=settings["min_window_s"])
            peaks[dtype] = max(peaks.get(dtype, 0.0), rate * 1e9)
            rows.append([dtype, n, f"{rate:,.1f}"])
    return rows, peaks


def run(args, command: str) -> dict[str, float]:
    settings = common.resolve(args, DEFAULTS, QUICK)
    rows, peaks = measure(settings)
    print(common.header(command))
    print()
    print(common.table(["dtype", "n (n x n @ n x n)", "GFLOP/s"], rows))
    print()
    print("peak (best size): " + ", ".join(f"{d} {p / 1e9:,.1f} GFLOP/s" for d, p in peaks.items())
          + f"; matmul precision: {jax.config.jax_default_matmul_precision or 'jax default'}")
    print(common.settings_line(settings))
    return peaks
