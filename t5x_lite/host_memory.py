"""Host memory for XLA:CPU: map a step's large buffers in 2 MiB pages, not 4 KiB ones.

XLA:CPU allocates a compiled program's temporary buffers (one block: 674 MiB for the d512
decoder's train step in bench/NOTES.md) afresh on every call and frees them after it.
glibc's malloc maps a block that large with mmap and unmaps it when freed, so every step faults
each page of it in again: about 173,000 page faults and 0.28 s of kernel CPU time per step of
that decoder (1.15 s of wall time on 2 cores). Where the kernel gives transparent huge pages on request
(`/sys/kernel/mm/transparent_hugepage/enabled` is `madvise`, the common default), glibc's
`glibc.malloc.hugetlb=1` tunable asks for them on every mapping of 2 MiB or more: about 950
faults per step, the same peak resident memory, and the step 1.09-1.13x faster.

glibc reads its tunables only when a process starts, so `run_program` starts the program again
(the same process id, arguments and environment, plus `GLIBC_TUNABLES`) before it imports JAX
or TensorFlow. It does nothing where the tunable is already set, where the kernel's huge pages
are `always` (the kernel already uses them) or `never`, elsewhere than Linux with glibc 2.35 or
later, and when `T5X_LITE_MALLOC=system`. The library never changes a process it is imported into.

Imports nothing from the package.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Callable

ENV = "T5X_LITE_MALLOC"
TUNABLES = "GLIBC_TUNABLES"
HUGE_PAGES = "glibc.malloc.hugetlb=1"
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_page_environment(environ: dict[str, str] | None = None) -> dict[str, str] | None:
    """The environment to start this program again with, or None where nothing would change."""
    environ = dict(os.environ if environ is None else environ)
    if environ.get(ENV, "").strip().lower() == "system":
        return None
    if "glibc.malloc.hugetlb" in environ.get(TUNABLES, ""):
        return None  # set already: by the user, or by the start this one came from
    if not _glibc() or _thp_mode() != "madvise":
        return None
    environ[TUNABLES] = ":".join(filter(None, (environ.get(TUNABLES), HUGE_PAGES)))
    return environ


def run_program(main: Callable[[], int | None]) -> None:
    """Runs an entry point's `main` as a program, started again first where huge pages would help."""
    environ = huge_page_environment()
    if environ is not None and sys.executable:  # an embedded interpreter has none to start
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
    sys.exit(main())


def _thp_mode() -> str | None:
    """The kernel's transparent huge page mode: the bracketed word of `always [madvise] never`."""
    try:
        text = THP_MODE.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def _glibc() -> bool:
    """Whether this is glibc 2.35 or later, the first with the hugetlb tunable (musl and others: no)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        version = ctypes.CDLL(None).gnu_get_libc_version
    except (OSError, AttributeError):
        return False
    version.restype = ctypes.c_char_p
    major, minor = (int(part) for part in version().decode().split(".")[:2])
    return (major, minor) >= (2, 35)
