"""What must not stop a run: a cache folder that cannot be written, processes building at once, a
compiler that hangs, a file under the key that is no library for this machine; each either
builds once or falls back to XLA with one warning line. And the checkpoint metadata records what
'auto' attention resolved to, without a resume elsewhere being refused for it."""

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

from t5x_lite import kernels
from t5x_lite.checkpoints import info as checkpoint_info
from t5x_lite.checkpoints.compatibility import check_compatible
from t5x_lite.data.task_access import DataConfig
from t5x_lite.kernels import build as kernel_module
from t5x_lite.models.decoder_only import DecoderConfig
from t5x_lite.training import run_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def real_library() -> Path:
    """The library built by the real compiler, in the test run's cache (conftest.py)."""
    return kernel_module._build(kernel_module._compiler())


def fake_compiler(tmp_path: Path, body: str, version: str = "fake-c++ 1.0") -> Path:
    """A compiler script that answers --version, counts its builds in tmp_path/runs, then runs `body`
    ($out: the output file)."""
    script = tmp_path / "bin" / "fake-c++"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "{version}"; exit 0; fi\n'
                      f'echo run >> "{tmp_path}/runs"\nfor out; do :; done\n{body}\n')
    script.chmod(0o755)
    return script


def runs(tmp_path: Path) -> int:
    path = tmp_path / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def unavailable_warnings(caplog) -> list[str]:
    """available()'s fallback, run afresh (load and available are cached per process)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernel_module, "load", kernel_module.load.__wrapped__)
        with caplog.at_level(logging.WARNING, logger=kernel_module.__name__):
            assert kernel_module.available.__wrapped__() is False
    return [record.getMessage() for record in caplog.records]


@pytest.mark.parametrize("where", ["a file", "/sys"])
def test_a_cache_folder_that_cannot_be_written_falls_back_with_one_warning_line(where, tmp_path, monkeypatch,
                                                                               caplog):
    if where == "a file":  # a regular file where the folder should be: even root cannot make it
        cache = tmp_path / "cache"
        cache.write_text("")
    else:  # sysfs takes no new folders, even from root
        if not Path("/sys/kernel").is_dir():
            pytest.skip("no sysfs here")
        cache = Path("/sys/t5x_lite_kernels")
    monkeypatch.setenv("T5X_LITE_KERNEL_CACHE", str(cache))
    with pytest.raises(kernels.KernelUnavailableError,
                       match=f"cache folder {cache} cannot be written .*T5X_LITE_KERNEL_CACHE"):
        kernel_module._build(kernel_module._compiler())
    [warning] = unavailable_warnings(caplog)
    assert "\n" not in warning and "runs on XLA" in warning and f"{cache} cannot be written" in warning
    assert not cache.is_dir()


_BUILD_WHEN_BOTH_ARE_READY = """
import pathlib, sys, time
from t5x_lite.kernels import build
ready = pathlib.Path(sys.argv[1])
(ready / sys.argv[2]).touch()
deadline = time.monotonic() + 120
while len(list(ready.iterdir())) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
library = build._load_library(build._compiler())
print(build.library_path(build._compiler()), library.t5x_lite_attention_fwd is not None)
"""


def test_two_processes_building_at_once_compile_once_and_both_load(real_library, tmp_path):
    compiler = fake_compiler(tmp_path, f'sleep 1\ncp "{real_library}" "$out"')
    cache, ready = tmp_path / "cache", tmp_path / "ready"
    ready.mkdir()
    env = {**os.environ, "CXX": str(compiler), "T5X_LITE_KERNEL_CACHE": str(cache)}
    processes = [subprocess.Popen([sys.executable, "-c", _BUILD_WHEN_BOTH_ARE_READY, str(ready), name], cwd=ROOT,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for name in ("a", "b")]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert [p.returncode for p in processes] == [0, 0], [err[-2000:] for _, err in outputs]
    printed = {out.strip() for out, _ in outputs}
    assert len(printed) == 1 and printed.pop().endswith(".so True")
    assert runs(tmp_path) == 1  # the second waited for the first's build and loaded it
    assert sorted(p.suffix for p in cache.iterdir()) == [".lock", ".so"]


def test_a_compiler_that_hangs_is_stopped_with_its_children_and_remembered(tmp_path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    # A child of the compiler sleeps on (as cc1plus would work on): it goes down with it.
    compiler = fake_compiler(tmp_path, f'sleep 60 &\necho $! > "{pid_file}"\nwait')
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv("T5X_LITE_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernel_module, "COMPILE_TIMEOUT_S", 1.0)
    start = time.monotonic()
    with pytest.raises(kernels.KernelUnavailableError, match="fake-c\\+\\+ did not finish within 1 s"):
        kernel_module._build(kernel_module._compiler())
    assert time.monotonic() - start < 30
    child = Path(f"/proc/{pid_file.read_text().strip()}/stat")
    deadline = time.monotonic() + 10
    while child.exists() and child.read_text().split(") ")[-1][0] not in "ZX" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not child.exists() or child.read_text().split(") ")[-1][0] in "ZX", "the compiler's child still runs"
    with pytest.raises(kernels.KernelUnavailableError, match="earlier build .*did not finish within 1 s.*remove"):
        kernel_module._build(kernel_module._compiler())
    assert runs(tmp_path) == 1


def test_a_file_under_the_key_that_does_not_load_is_built_again(real_library, tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(fake_compiler(tmp_path, f'cp "{real_library}" "$out"')))
    monkeypatch.setenv("T5X_LITE_KERNEL_CACHE", str(tmp_path / "cache"))
    compiler = kernel_module._compiler()
    planted = kernel_module.library_path(compiler)
    planted.parent.mkdir()
    planted.write_bytes(b"a library for another machine")
    library = kernel_module._load_library(compiler)
    assert library.t5x_lite_attention_fwd is not None and runs(tmp_path) == 1
    assert planted.read_bytes() == real_library.read_bytes()


def test_a_library_that_never_loads_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(fake_compiler(tmp_path, 'echo "not a library" > "$out"')))
    monkeypatch.setenv("T5X_LITE_KERNEL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(kernels.KernelUnavailableError, match="was built but does not load"):
        kernel_module._load_library(kernel_module._compiler())
    assert runs(tmp_path) == 2  # built, found not to load, built once more


def test_the_key_holds_the_machine_and_the_compiler_version(tmp_path, monkeypatch):
    monkeypatch.setenv("T5X_LITE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(fake_compiler(tmp_path, "exit 1", version="fake-c++ 1.0")))
    first = kernel_module.library_path(kernel_module._compiler())
    monkeypatch.setattr(kernel_module.platform, "machine", lambda: "aarch64")
    other_machine = kernel_module.library_path(kernel_module._compiler())
    assert other_machine != first and other_machine.name.startswith("libt5x_lite_kernels-aarch64-")
    fake_compiler(tmp_path, "exit 1", version="fake-c++ 2.0")
    assert kernel_module.library_path(kernel_module._compiler()) not in (first, other_machine)


def test_checkpoint_metadata_records_the_resolved_attention_and_a_resume_that_resolves_otherwise_is_accepted(
        monkeypatch):
    model = DecoderConfig(vocab_size=512, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_layers=2, max_len=64)
    spec = run_spec.RunSpec(model=model, train_data=DataConfig("t", sequence_length=64, batch_size=8),
                            train_steps=10)
    monkeypatch.setattr(jax, "device_count", lambda *args: 1)
    monkeypatch.setattr(kernels, "available", lambda: True)
    with_kernel = run_spec.checkpoint_metadata(spec, vocab_size=500)
    monkeypatch.setattr(kernels, "available", lambda: False)
    without = run_spec.checkpoint_metadata(spec, vocab_size=500)
    assert (with_kernel["attention"], without["attention"]) == ("explicit_blas", "explicit")
    assert with_kernel["model"]["attention_implementation"] == without["model"]["attention_implementation"] == "auto"
    check_compatible(with_kernel, without, model_dir="/nowhere")
    check_compatible(without, with_kernel, model_dir="/nowhere")
    text = checkpoint_info.format_info({"model_dir": "/run", "step": 1, "steps_present": [1], "states": [],
                                        "metadata": with_kernel, "data_iterator": {}, "arrays": {}, "config": None})
    assert "\nattention: explicit_blas\n" in text
