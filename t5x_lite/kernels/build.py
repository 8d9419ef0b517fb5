"""Builds, loads and registers the native CPU kernels (the `.cc` and `.h` files beside this one).

They are compiled into one shared library with the C++ compiler (`CXX`, else g++ or c++) on
first use, against jaxlib's FFI headers, into a cache folder ($T5X_LITE_KERNEL_CACHE, else
$XDG_CACHE_HOME/t5x_lite/kernels, else ~/.cache/t5x_lite/kernels). The library's name holds the
machine and a key of all that makes it: the sources, jaxlib's version, the operating system and
machine (`platform`), the compiler, the first line of its `--version` and the flags; hosts of
other machines or compilers sharing a cache folder each get their own.

One build per key: a process takes the key's `.lock` file (waiting while another builds),
compiles to a temporary name within COMPILE_TIMEOUT_S and renames it into place, so the others
load its result. A failed build (the compiler's error, or its timeout) is remembered in a
`.failed` file beside the library's name, holding the error's first line: later processes give up
at once, until that file is removed. A cached library that does not load (damaged, or not one for
this machine) is built again once.

Every failure is a `KernelUnavailableError` whose first line says what happened and the fix;
`available()` logs that line as one warning and returns False ('auto' attention then runs on
XLA). The kernels' products are scipy's OpenBLAS sgemm: loading the library sets scipy's
OpenBLAS to one thread for the rest of the process (the kernels spread their work over XLA's
threads; numpy's own BLAS is a separate library and keeps its threads).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

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
# Seconds the compiler gets (about 4 s is usual), and its `--version`; then it is stopped, and
# the build counts as failed.
COMPILE_TIMEOUT_S = 120.0
# Beyond that, how long a process waits for another's build of the same key.
LOCK_MARGIN_S = 30.0
FIX = "Set attention_implementation='explicit' to run without it."

log = logging.getLogger(__name__)


class KernelUnavailableError(UserError, RuntimeError):
    """The native CPU kernels cannot be built or loaded here; the message's first line says why and what to use."""


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


def _run(command: list[str]) -> subprocess.CompletedProcess:
    """Runs `command` in a process group of its own; after COMPILE_TIMEOUT_S the whole group (a
    compiler's own subprocesses too) is killed and TimeoutExpired raised."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          errors="replace", start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _compiler_version(compiler: str) -> str:
    """The first line of `compiler --version`."""
    try:
        result = _run([compiler, "--version"])
    except (OSError, subprocess.TimeoutExpired) as e:
        raise KernelUnavailableError(f"The C++ compiler {compiler} does not tell its version ({e}). {FIX}") from None
    lines = (result.stdout or result.stderr).strip().splitlines()
    if result.returncode != 0 or not lines:
        raise KernelUnavailableError(
            f"The C++ compiler {compiler} does not tell its version (`{compiler} --version` exited with status "
            f"{result.returncode}). {FIX}")
    return lines[0].strip()


def library_path(compiler: str) -> Path:
    """Where the library built by `compiler` from these sources for this machine is cached."""
    machine = platform.machine() or "unknown"
    parts = [*(path.name.encode() + b"\0" + path.read_bytes() for path in SOURCES + HEADERS),
             *(text.encode() for text in (jaxlib.__version__, platform.system(), machine, compiler,
                                          _compiler_version(compiler), " ".join(FLAGS)))]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    return cache_dir() / f"libt5x_lite_kernels-{re.sub(r'[^A-Za-z0-9_]', '_', machine)}-{key}.so"


def _failed_marker(library: Path) -> Path:
    return library.with_suffix(".failed")


def _remembered_failure(marker: Path) -> KernelUnavailableError:
    try:
        line = (marker.read_text(errors="replace").strip().splitlines() or ["no message kept"])[0]
    except OSError:
        line = "no message kept"
    return KernelUnavailableError(
        f"An earlier build of the native CPU attention kernel by this compiler failed ({line}); remove {marker} "
        f"to try again. {FIX}")


@contextlib.contextmanager
def _build_lock(library: Path) -> Iterator[None]:
    """Holds the key's lock file, waiting for a build in progress elsewhere (its compiler's timeout,
    and a margin, at most)."""
    try:
        library.parent.mkdir(parents=True, exist_ok=True)
        handle = open(library.with_suffix(".lock"), "a")
    except OSError as e:
        raise KernelUnavailableError(
            f"The native CPU attention kernel cannot be built: its cache folder {library.parent} cannot be written "
            f"({e.strerror or e}). Set T5X_LITE_KERNEL_CACHE to a writable folder, or attention_implementation="
            "'explicit' to run without it.") from None
    with handle:
        _lock(handle)
        yield  # closing the file releases the lock


def _lock(handle) -> None:
    """Locks `handle`'s file, waiting while another process holds it. Where the system or the file
    system has no locks, takes none: each process builds, and the rename still publishes only whole
    libraries."""
    try:
        import fcntl
    except ImportError:
        return
    deadline = time.monotonic() + COMPILE_TIMEOUT_S + LOCK_MARGIN_S
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise KernelUnavailableError(
                    f"Another process has been building the native CPU attention kernel for over "
                    f"{COMPILE_TIMEOUT_S + LOCK_MARGIN_S:g} s ({handle.name} is locked). {FIX}") from None
            time.sleep(0.1)
        except OSError:
            return


def _first_error_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower()), lines[0] if lines else "no message")


def _compile(compiler: str, library: Path) -> None:
    """Compiles to a temporary name and renames it to `library`: a build killed midway or a
    concurrent one never leaves a half-written library under that name. A failure is remembered."""
    fd, partial = tempfile.mkstemp(dir=library.parent, prefix=library.stem + ".", suffix=".partial")
    os.close(fd)
    command = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", partial]
    try:
        try:
            result = _run(command)
        except subprocess.TimeoutExpired:
            summary, details = f"{compiler} did not finish within {COMPILE_TIMEOUT_S:g} s", ""
        else:
            if result.returncode == 0:
                os.replace(partial, library)
                return
            summary = f"{compiler} exited with status {result.returncode}: {_first_error_line(result.stderr)}"
            details = f"\n{' '.join(command)}\n{result.stderr[-2000:]}"
        marker = _failed_marker(library)
        with contextlib.suppress(OSError):
            marker.write_text(summary + "\n")
        raise KernelUnavailableError(
            f"Building the native CPU attention kernel failed ({summary}); runs with this compiler skip it until "
            f"{marker} is removed. {FIX}{details}")
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _build(compiler: str, *, stale: os.stat_result | None = None) -> Path:
    """The library's path, compiled first where the cache has none (or only the file `stale`)."""
    library = library_path(compiler)

    def cached() -> bool:
        if not library.exists():
            return False
        current = library.stat()
        return stale is None or (current.st_ino, current.st_mtime_ns) != (stale.st_ino, stale.st_mtime_ns)

    if cached():
        return library
    if _failed_marker(library).exists():
        raise _remembered_failure(_failed_marker(library))
    with _build_lock(library):
        if cached():  # another process built it while this one waited
            return library
        if _failed_marker(library).exists():
            raise _remembered_failure(_failed_marker(library))
        _compile(compiler, library)
    return library


def _open(path: Path) -> ctypes.CDLL:
    """The library loaded; OSError where it is no loadable library for this process."""
    library = ctypes.CDLL(str(path))
    missing = [name for name in (*TARGETS, "t5x_lite_use_sgemm") if not hasattr(library, name)]
    if missing:
        raise KernelUnavailableError(f"{path} lacks {', '.join(missing)}: remove it to build it again. {FIX}")
    return library


def _load_library(compiler: str) -> ctypes.CDLL:
    """Builds (once per cache and key) and loads the library; one that does not load is built again once."""
    path = _build(compiler)
    seen = path.stat()
    try:
        return _open(path)
    except OSError as e:
        log.warning("The cached native CPU attention kernel %s does not load (%s); building it again.", path, e)
    path = _build(compiler, stale=seen)
    try:
        return _open(path)
    except OSError as e:
        raise KernelUnavailableError(f"The native CPU attention kernel was built but does not load ({e}). {FIX}") \
            from None


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
    """Builds (once per cache) and loads the kernels, and registers them with XLA for the CPU.
    Raises KernelUnavailableError, whatever stops them."""
    try:
        library = _load_library(_compiler())
        if library.t5x_lite_use_sgemm(ctypes.c_void_p(_scipy_sgemm())) != 0:
            raise KernelUnavailableError(
                "The native CPU attention kernel runs on scipy's OpenBLAS, and this scipy's BLAS is not OpenBLAS. "
                f"{FIX}")
        for target in TARGETS:
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, target)), platform="cpu")
    except KernelUnavailableError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever stops the kernel (a full disk, no scipy...), runs go on without it
        raise KernelUnavailableError(
            f"The native CPU attention kernel could not be built or loaded ({type(e).__name__}: {e}). {FIX}") from e
    return library


@functools.cache
def available() -> bool:
    """Whether the kernels build and load here (a compiler, a writable cache, scipy on OpenBLAS);
    where not, one warning line says why."""
    try:
        load()
    except KernelUnavailableError as e:
        log.warning("The native CPU attention kernel is unavailable, so attention runs on XLA: %s",
                    str(e).splitlines()[0].replace(f" {FIX}", ""))
        return False
    return True
