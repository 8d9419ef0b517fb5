"""Building the native CPU kernels: once per source into its cache, under its final name only
when complete, with one clear error where they cannot be built, a failure remembered
(test_build_failures.py: what else can go wrong)."""

import ctypes
from pathlib import Path

import pytest

from t5x_lite import kernels
from t5x_lite.kernels import build as kernel_module


def test_built_once_per_source_under_its_final_name_with_every_handler(tmp_path, monkeypatch):
    monkeypatch.setenv("T5X_LITE_KERNEL_CACHE", str(tmp_path))
    compiler = kernel_module._compiler()
    first = kernel_module._build(compiler)
    assert first.parent == tmp_path and first.stat().st_size > 0
    built_at = first.stat().st_mtime_ns
    assert kernel_module._build(compiler) == first and first.stat().st_mtime_ns == built_at
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, first.with_suffix(".lock").name])
    library = ctypes.CDLL(str(first))
    for name in (*kernel_module.TARGETS, "t5x_lite_use_sgemm"):
        assert hasattr(library, name), name


def test_every_source_keys_the_build(tmp_path, monkeypatch):
    """Editing any source or header, not only one, builds a new library."""
    monkeypatch.setenv("T5X_LITE_KERNEL_CACHE", str(tmp_path / "cache"))
    sources = tmp_path / "src"
    sources.mkdir()
    for path in kernel_module.SOURCES + kernel_module.HEADERS:
        (sources / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(kernel_module, "SOURCES", tuple(sorted(sources.glob("*.cc"))))
    monkeypatch.setattr(kernel_module, "HEADERS", tuple(sorted(sources.glob("*.h"))))
    compiler = kernel_module._compiler()
    first = kernel_module._build(compiler)
    header = sources / "blas.h"
    header.write_text(header.read_text() + "\n// edited\n")
    assert kernel_module._build(compiler) != first


def test_a_failed_build_raises_one_error_leaves_no_library_and_is_remembered_until_removed(tmp_path, monkeypatch):
    failing = tmp_path / "bin" / "broken-c++"
    failing.parent.mkdir()
    runs = tmp_path / "runs"
    failing.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'broken-c++ 1.0'; exit 0; fi\n"
                       f"echo run >> {runs}\necho 'In file x.cc:' >&2\necho 'x.cc:1: error: no such thing' >&2\n"
                       "exit 1\n")
    failing.chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setenv("T5X_LITE_KERNEL_CACHE", str(cache))
    monkeypatch.setenv("CXX", str(failing))
    compiler = kernel_module._compiler()
    with pytest.raises(kernels.KernelUnavailableError, match="(?s)failed.*no such thing.*'explicit'") as first:
        kernel_module._build(compiler)
    marker = kernel_module.library_path(compiler).with_suffix(".failed")
    # The compiler's first error line, in the message's first line and in the marker.
    assert "status 1: x.cc:1: error: no such thing" in str(first.value).splitlines()[0]
    assert marker.read_text() == f"{failing} exited with status 1: x.cc:1: error: no such thing\n"
    assert sorted(p.suffix for p in cache.iterdir()) == [".failed", ".lock"]
    # Later builds give up at once, naming the marker, without running the compiler...
    with pytest.raises(kernels.KernelUnavailableError, match=f"earlier build .*no such thing.*remove {marker} to try"):
        kernel_module._build(compiler)
    assert runs.read_text() == "run\n"
    # ...until it is removed.
    marker.unlink()
    with pytest.raises(kernels.KernelUnavailableError, match="Building the native CPU attention kernel failed"):
        kernel_module._build(compiler)
    assert runs.read_text() == "run\nrun\n"


def test_no_compiler_names_the_fix(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(kernel_module.shutil, "which", lambda name: None)
    with pytest.raises(kernels.KernelUnavailableError, match="C\\+\\+ compiler.*attention_implementation='explicit'"):
        kernel_module._compiler()


def test_cache_dir_follows_the_environment(monkeypatch):
    monkeypatch.delenv("T5X_LITE_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert kernel_module.cache_dir() == Path("/somewhere/t5x_lite/kernels")
    monkeypatch.setenv("T5X_LITE_KERNEL_CACHE", "/elsewhere")
    assert kernel_module.cache_dir() == Path("/elsewhere")
