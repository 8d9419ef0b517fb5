"""`batched_matmul`: float32 alpha op(a) @ op(b) over leading batch dims, on the native CPU kernel.

The kernel (sgemm_batch.cc) runs each matrix of the batch as one single-threaded sgemm of
scipy's OpenBLAS and spreads the matrices over XLA's intra-op threads. It is built from source
with the C++ compiler (`CXX`, else g++ or c++) on first use, against jaxlib's FFI headers, into
a cache folder keyed by the source, jaxlib's version and the compiler
($T5X_LITE_KERNEL_CACHE, else $XDG_CACHE_HOME/t5x_lite/kernels, else ~/.cache/t5x_lite/kernels).

Loading it sets scipy's OpenBLAS to one thread for the rest of the process (numpy's own BLAS
is a separate library and keeps its threads).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from t5x_lite.errors import UserError

TARGET = "t5x_lite_batched_matmul"
SOURCE = Path(__file__).with_suffix(".cc")
FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC")


class KernelUnavailableError(UserError, RuntimeError):
    """The native CPU kernel cannot be built or loaded here; the message says why and what to use."""


def cache_dir() -> Path:
    """Where built kernels are kept (see the module docstring)."""
    if os.environ.get("T5X_LITE_KERNEL_CACHE"):
        return Path(os.environ["T5X_LITE_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "t5x_lite" / "kernels"


def _compiler() -> str:
    for name in filter(None, (os.environ.get("CXX"), "g++", "c++")):
        if shutil.which(name):
            return name
    raise KernelUnavailableError(
        "The native CPU attention kernel needs a C++ compiler (g++; or set CXX), and none was found. Install one "
        "(Debian/Ubuntu: apt-get install g++) or set attention_implementation='explicit'.")


def _build(compiler: str) -> Path:
    """Compiles the kernel once per (source, jaxlib, compiler); returns the shared library's path."""
    key = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), jaxlib.__version__.encode(), compiler.encode(),
                                     " ".join(FLAGS).encode()])).hexdigest()[:16]
    library = cache_dir() / f"libt5x_lite_sgemm_batch-{key}.so"
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name and renamed: a concurrent build or a killed one never leaves a
    # half-written library under the final name.
    fd, partial = tempfile.mkstemp(dir=library.parent, prefix=library.stem + ".", suffix=".partial")
    os.close(fd)
    command = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", partial]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise KernelUnavailableError(
                f"Building the native CPU attention kernel failed ({' '.join(command)}):\n{result.stderr[-2000:]}\n"
                "Set attention_implementation='explicit' to run without it.")
        os.replace(partial, library)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return library


def _scipy_sgemm() -> int:
    """The address of the Fortran sgemm that scipy.linalg.cython_blas exports."""
    from scipy.linalg import cython_blas

    capsule = cython_blas.__pyx_capi__["sgemm"]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get_pointer(capsule, get_name(capsule))


@functools.cache
def load() -> ctypes.CDLL:
    """Builds (once per cache) and loads the kernel, and registers it with XLA for the CPU."""
    library = ctypes.CDLL(str(_build(_compiler())))
    if library.t5x_lite_use_sgemm(ctypes.c_void_p(_scipy_sgemm())) != 0:
        raise KernelUnavailableError(
            "The native CPU attention kernel runs on scipy's OpenBLAS, and this scipy's BLAS is not OpenBLAS. "
            "Set attention_implementation='explicit'.")
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.t5x_lite_batched_matmul), platform="cpu")
    return library


@functools.cache
def available() -> bool:
    """Whether the kernel builds and loads here (a compiler, scipy on OpenBLAS)."""
    try:
        load()
    except KernelUnavailableError as e:
        logging.getLogger(__name__).warning("The native CPU kernel is unavailable; attention's products run on "
                                            "XLA instead. %s", e)
        return False
    return True


def batched_matmul(a: jax.Array, b: jax.Array, *, transpose_a: bool = False, transpose_b: bool = False,
                   alpha: float = 1.0) -> jax.Array:
    """alpha * op(a) @ op(b) for each index of the leading dims that a and b share; float32, CPU only.

    op transposes the last two dims where asked: [..., m, k] @ [..., k, n] -> [..., m, n]. The
    scale `alpha` is applied inside sgemm, with no pass of its own over the result.
    Not differentiable: callers write their own backward pass from further products
    (models/explicit_attention.py).
    """
    if a.dtype != jnp.float32 or b.dtype != jnp.float32:
        raise TypeError(f"batched_matmul takes float32 arrays, not {a.dtype} and {b.dtype}.")
    if a.ndim < 2 or a.shape[:-2] != b.shape[:-2]:
        raise ValueError(f"batched_matmul needs the same leading (batch) dims, not {a.shape} and {b.shape}.")
    m, k = a.shape[-2:][::-1] if transpose_a else a.shape[-2:]
    k_b, n = b.shape[-2:][::-1] if transpose_b else b.shape[-2:]
    if k != k_b:
        raise ValueError(f"batched_matmul: contracting dims differ ({a.shape}, transpose_a={transpose_a}; "
                         f"{b.shape}, transpose_b={transpose_b}).")
    load()
    out = jax.ShapeDtypeStruct(a.shape[:-2] + (m, n), jnp.float32)
    return jax.ffi.ffi_call(TARGET, out, vmap_method="broadcast_all")(
        a, b, transpose_a=transpose_a, transpose_b=transpose_b, alpha=np.float32(alpha))
