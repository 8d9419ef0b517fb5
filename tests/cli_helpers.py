"""Helpers for tests that drive the real CLI in a subprocess."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 512
VALIDATION_FRACTION = 0.27  # of the stdlib subsets prepared for tests (`prepare_stdlib_subset`)
TINY_MODEL = [
    f"--gin.DecoderConfig.vocab_size={VOCAB}",
    "--gin.DecoderConfig.emb_dim=64",
    "--gin.DecoderConfig.num_layers=2",
    "--gin.DecoderConfig.mlp_dim=128",
    "--gin.DecoderConfig.head_dim=16",
    "--gin.DecoderConfig.max_len=64",
    "--gin.SEQUENCE_LENGTH=64",
    "--gin.BATCH_SIZE=8",
    "--gin.train.eval_batches=2",
    "--gin.train.sample_prompt=None",
]


# Set by tests/conftest.py (faster compiles of the tests' tiny programs); the same in every CLI process.
TEST_XLA_FLAGS = os.environ.get("T5X_LITE_TEST_XLA_FLAGS", "")


def cli_env(devices: int = 1, extra_pythonpath: str | None = None) -> dict[str, str]:
    """The environment of a CLI subprocess: this checkout importable, `devices` host CPU devices."""
    pythonpath = str(ROOT) if extra_pythonpath is None else f"{ROOT}{os.pathsep}{extra_pythonpath}"
    env = {**os.environ, "PYTHONPATH": pythonpath, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONUNBUFFERED": "1",
           "XLA_FLAGS": f"{TEST_XLA_FLAGS} --xla_force_host_platform_device_count={devices}".strip()}
    cache = os.environ.get("T5X_LITE_TEST_COMPILATION_CACHE")
    if cache:  # set by tests/conftest.py: runs of the same program compile it once
        env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.2")
    return env


def run_cli(*args: str, devices: int = 1, timeout: int = 600, extra_pythonpath: str | None = None,
            extra_env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """Runs `t5x-lite ARGS` on `devices` host CPU devices and captures its output (`extra_env`:
    variables set, or removed where None)."""
    env = {**cli_env(devices, extra_pythonpath), **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "t5x_lite.cli", *args], cwd=ROOT,
                          env={k: v for k, v in env.items() if v is not None}, capture_output=True, text=True,
                          timeout=timeout)


def run_cli_in_process(*args: str) -> subprocess.CompletedProcess:
    """`t5x-lite ARGS` through the CLI's `main` in this process, from the repository root: its exit
    code (returned or raised) and what it printed. For checks of what a command refuses before any
    work (the message and exit code): a pytest worker has 8 host devices and its imports done;
    `run_cli` is the real process (start-up output, signals, the device count a user gets)."""
    import contextlib
    import io

    import gin

    from t5x_lite import cli

    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as e:
                code = e.code
    finally:
        os.chdir(cwd)
        gin.clear_config()  # leave no run's bindings to the next test in this process
    return subprocess.CompletedProcess(["t5x-lite", *args], code, out.getvalue(), err.getvalue())


def start_cli(*args: str, devices: int = 1) -> subprocess.Popen:
    """Starts `t5x-lite ARGS` with stdout and stderr merged, readable line by line as it runs."""
    return subprocess.Popen([sys.executable, "-m", "t5x_lite.cli", *args], cwd=ROOT, env=cli_env(devices),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_processes(command: list[str], logs: Path, *, count: int = 2, devices: int = 1, port: int,
                  timeout: int = 300) -> list[tuple[int, str, str]]:
    """`python COMMAND` as processes 0..count-1 of one JAX run (coordinator on 127.0.0.1:port,
    `devices` host devices each); returns each one's (exit code, stdout, stderr). Output goes to
    files under `logs`: a full pipe cannot stall a collective."""
    env = {**cli_env(devices), "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    files = [(logs / f"process{i}.out", logs / f"process{i}.err") for i in range(count)]
    procs = []
    try:
        for i, (out, err) in enumerate(files):
            with out.open("w") as stdout, err.open("w") as stderr:
                procs.append(subprocess.Popen(
                    [sys.executable, *command, f"--coordinator_address=127.0.0.1:{port}",
                     f"--num_processes={count}", f"--process_id={i}", "--distributed_timeout=60"],
                    cwd=ROOT, env=env, stdout=stdout, stderr=stderr))
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, out.read_text(), err.read_text()) for p, (out, err) in zip(procs, files)]


@contextlib.contextmanager
def importable_module(folder: Path, name: str, source: str) -> Iterator[Path]:
    """`folder`/`name`.py holding `source`, importable (as from a user's PYTHONPATH) while inside:
    a user's own module that a gin file's `import` line loads."""
    (folder / f"{name}.py").write_text(source)
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(name, None)


def train(data_dir: Path, model_dir: Path, *extra: str, devices: int = 1,
          extra_env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """The quickstart run with a tiny model on `data_dir`, plus `extra` flags."""
    return run_cli("train", "--gin_file=runs/quickstart.gin", f"--gin.DATA_DIR='{data_dir}'",
                   f"--gin.MODEL_DIR='{model_dir}'", *TINY_MODEL, *extra, devices=devices, extra_env=extra_env)


def train_in_process(data_dir: Path, model_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """`train`'s flags for the quickstart run with a tiny model, through `run_cli_in_process`."""
    return run_cli_in_process("train", "--gin_file=runs/quickstart.gin", f"--gin.DATA_DIR='{data_dir}'",
                              f"--gin.MODEL_DIR='{model_dir}'", *TINY_MODEL, *extra)


def losses(stdout: str) -> list[float]:
    """The train losses a run printed, in order."""
    return [float(x) for x in re.findall(r"step \d+: loss=([0-9.]+)", stdout)]


def prepare_stdlib_subset(out: Path, packages: list[str]) -> Path:
    """Prepares some of the stdlib's packages with the tiny vocabulary."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    inputs = [f"--input={stdlib / p}" for p in packages]
    # The packages' .py files only (their __pycache__ is binary, skipped): json/encoder.py is the
    # validation split of both fixtures (its key's split hash is 0.253).
    result = run_cli("prepare", *inputs, f"--out={out}", f"--vocab_size={VOCAB}",
                     "--num_shards=2", f"--validation_fraction={VALIDATION_FRACTION}", "--num_workers=2")
    assert result.returncode == 0, result.stderr
    return out


@contextlib.contextmanager
def unwritable_directory(path: Path) -> Iterator[Path]:
    """A new directory at `path` that this process cannot write: immutable (chattr +i) as root, whom
    permissions do not stop, else mode 555; the test is skipped where neither works. Made writable
    again afterwards."""
    import pytest

    path.mkdir()
    immutable = os.geteuid() == 0 and shutil.which("chattr") and subprocess.run(
        ["chattr", "+i", str(path)], capture_output=True).returncode == 0
    if not immutable:
        path.chmod(0o555)
    try:
        if os.access(path, os.W_OK):
            pytest.skip("no way to make a directory unwritable here (root without chattr +i)")
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755)
