"""Kernels: native CPU code that XLA calls as FFI custom calls, built from source on first use.

Owns:
  sgemm_batch.cc  the float32 batched matmul: one single-threaded OpenBLAS sgemm per matrix,
                  the matrices spread over XLA's intra-op threads
  sgemm_batch.py  builds it (a C++ compiler, jaxlib's FFI headers, a cache folder), loads it,
                  registers it with XLA, and the `batched_matmul` op that calls it

The explicit attention's 'explicit_blas' form runs its six products here
(models/explicit_attention.py); `models.layers.attention_implementation('auto')` picks it on a
single CPU device in float32 where the kernel builds. Public names: `batched_matmul`,
`available`, `load`, `KernelUnavailableError`.

May import: `t5x_lite.errors` only (pyproject.toml's layers contract).
"""

from t5x_lite.kernels.sgemm_batch import KernelUnavailableError, available, batched_matmul, load

__all__ = ["KernelUnavailableError", "available", "batched_matmul", "load"]
