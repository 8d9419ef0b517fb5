"""Kernels: native CPU code that XLA calls as FFI custom calls, built from source on first use.

Owns:
  blas.h, blas.cc  what the kernels share: scipy's OpenBLAS sgemm (set to one thread) in
                   row-major terms, and a parallel loop over XLA's intra-op threads
  attention.cc     fused float32 softmax attention, forward and backward: one task per
                   (batch row, key/value head), its products and softmax done while its
                   scores are in cache, q, k and v read in their [batch, length, heads, head_dim]
                   layout
  attention.py     `attention`, the differentiable op that calls it
  build.py         compiles the `.cc` files into one library (a C++ compiler, jaxlib's FFI
                   headers, a cache folder; one build per machine, compiler and sources, under
                   a lock, within a timeout, a failure remembered), loads it and registers its
                   handlers with XLA; any failure is a `KernelUnavailableError`

The explicit attention's 'explicit_blas' form runs here (models/explicit_attention.py);
`models.layers.attention_implementation('auto')` picks it on a single CPU device in float32
where the kernels build, else XLA (after one warning line). Public names: `attention`,
`available`, `load`, `KernelUnavailableError`.

May import: `t5x_lite.errors` only (pyproject.toml's layers contract).
"""

from t5x_lite.kernels.attention import attention
from t5x_lite.kernels.build import KernelUnavailableError, available, load

__all__ = ["KernelUnavailableError", "attention", "available", "load"]
