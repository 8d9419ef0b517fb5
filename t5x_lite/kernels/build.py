"""Builds, loads and registers the native CPU kernels (the `.cc` and `.h` files beside this one).

They are compiled into one shared library with the C++ compiler (`CXX`, else g++ or c++) on
first use, against jaxlib's FFI headers, into a cache folder keyed by the sources, jaxlib's
version, the compiler and its flags ($T5X_LITE_KERNEL_CACHE, else
$XDG_CACHE_HOME/t5x_lite/kernels, else ~/.cache/t5x_lite/kernels). The kernels' products are
scipy's OpenBLAS sgemm: loading the library sets scipy's OpenBLAS to one thread for the rest of
the process (the kernels spread their work over XLA's threads; numpy's own BLAS is a separate
library and keeps its threads).
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
import jaxlib

from t5x_lite.errors import UserError

HERE = Path(__file__).parent
SOURCES = tuple(sorted(HERE.glob("*.cc")))
HEADERS = tuple(sorted(HERE.glob("*.h")))
# The XLA FFI handlers the library exports, each registered under its own name.
TARGETS = ("t5x_lite_attention_fwd", "t5x_lite_attention_bwd")
# -fopenmp-simd: the `omp simd` reductions vectorize (no OpenMP runtime is linked).
FLAGS = ("-O3", "-std=c++17", "-fopenmp-simd", "-shared", "-fPIC")


class KernelUnavailableError(UserError, RuntimeError):
    """The native CPU kernels cannot be built or loaded here; the message says why and what to use."""


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
    """Compiles the kernels once per (sources, jaxlib, compiler); returns the shared library's path."""
    key = hashlib.sha256(b"\0".join([*(path.name.encode() + b"\0" + path.read_bytes() for path in SOURCES + HEADERS),
                                     jaxlib.__version__.encode(), compiler.encode(), " ".join(FLAGS).encode()]))
    library = cache_dir() / f"libt5x_lite_kernels-{key.hexdigest()[:16]}.so"
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name and renamed: a concurrent build or a killed one never leaves a
    # half-written library under the final name.
    fd, partial = tempfile.mkstemp(dir=library.parent, prefix=library.stem + ".", suffix=".partial")
    os.close(fd)
    command = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", partial]
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
    """Builds (once per cache) and loads the kernels, and registers them with XLA for the CPU."""
    library = ctypes.CDLL(str(_build(_compiler())))
    if library.t5x_lite_use_sgemm(ctypes.c_void_p(_scipy_sgemm())) != 0:
        raise KernelUnavailableError(
            "The native CPU attention kernel runs on scipy's OpenBLAS, and this scipy's BLAS is not OpenBLAS. "
            "Set attention_implementation='explicit'.")
    for target in TARGETS:
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, target)), platform="cpu")
    return library


@functools.cache
def available() -> bool:
    """Whether the kernels build and load here (a compiler, scipy on OpenBLAS)."""
    try:
        load()
    except KernelUnavailableError as e:
        logging.getLogger(__name__).warning("The native CPU kernel is unavailable; attention runs on XLA instead. %s",
                                            e)
        return False
    return True
