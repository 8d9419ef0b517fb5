"""Test set-up: 8 host-platform CPU devices, set before JAX is imported anywhere."""

import fcntl
import inspect
import os
import re
import shutil
import socket
import sys
import tempfile
from pathlib import Path

# The tests' programs are tiny and most of their time is compiling: XLA:CPU's backend at LLVM's
# level 0 compiles a tiny model's train step in about 60% of the time (the HLO passes, fusions and
# buffers are the same; only the machine code is less optimised). CLI subprocesses get the same
# flags (tests/cli_helpers.py: cli_env); T5X_LITE_TEST_XLA_FLAGS= (empty) compiles as users do.
os.environ.setdefault("T5X_LITE_TEST_XLA_FLAGS", "--xla_backend_optimization_level=0")
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), os.environ["T5X_LITE_TEST_XLA_FLAGS"],
                                    "--xla_force_host_platform_device_count=8"]).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The native CPU kernel (t5x_lite/kernels) is built once into this folder, not the user's cache;
# its file name carries a hash of the source, so a changed kernel is built anew.
os.environ.setdefault("T5X_LITE_KERNEL_CACHE", os.path.join(tempfile.gettempdir(), "t5x_lite_test_kernels"))

# CLI subprocesses of one test run share compiled programs through JAX's persistent cache
# (many whole-run tests compile the same tiny train step); the controller deletes it at the end.
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
os.environ.setdefault("T5X_LITE_TEST_COMPILATION_CACHE",
                      os.path.join(tempfile.gettempdir(), "t5x_lite_test_compilation_cache", _RUN_ID))
# So do the tests run in the pytest processes themselves: the two workers compile many of the same
# programs (a module's jitted functions, a tiny model's steps built anew by each test's Trainer).
if os.environ["T5X_LITE_TEST_COMPILATION_CACHE"]:  # set empty: no cache
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["T5X_LITE_TEST_COMPILATION_CACHE"]
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


import pytest  # noqa: E402 (after the environment is set)


def _built_once(tmp_path_factory, name: str, build) -> Path:
    """`build(directory)` run once per test run: the pytest-xdist workers share the directory
    (the first to take the lock builds it, the others wait; read it only)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's directory, above each worker's own
    target = base / "built_once" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        complete = target.parent / f"{name}.complete"
        if not complete.exists():
            shutil.rmtree(target, ignore_errors=True)
            build(target)
            complete.touch()
    return target


def _prepared_once(tmp_path_factory, name: str, packages: list[str]) -> Path:
    from tests.cli_helpers import prepare_stdlib_subset

    return _built_once(tmp_path_factory, name, lambda target: prepare_stdlib_subset(target, packages))


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """The stdlib's json and urllib packages prepared with a 512-piece vocabulary."""
    return _prepared_once(tmp_path_factory, "tiny", ["json", "urllib"])


@pytest.fixture(scope="session")
def small_data_dir(tmp_path_factory):
    """Only the stdlib's json package: small enough for whole epochs in a test."""
    return _prepared_once(tmp_path_factory, "small", ["json"])


@pytest.fixture(scope="session")
def trained_run(data_dir, tmp_path_factory):
    """(model directory, stdout) of the CLI's main tiny run, trained once per test run: 40 steps
    with evaluations at 20 and 40, multiple choice, samples and a profile of steps 5-7.
    tests/cli/test_cli_run.py checks what it printed and wrote; other tests start from it or point
    at it (read it only: copy it to change it)."""
    import json

    from tests.cli_helpers import train

    def build(target: Path) -> None:
        target.mkdir(parents=True)
        choices = target / "choices.jsonl"
        choices.write_text("".join(json.dumps({"context": f"def f{i}(x):", "label": i % 3,
                                               "endings": ["return x", "pass", "import os"]}) + "\n"
                                   for i in range(6)))
        result = train(data_dir, target / "run", "--gin.TRAIN_STEPS=40", "--gin.train.log_period=5",
                       "--gin.train.checkpoint_period=10", "--gin.RetentionPolicy.keep_last=2",
                       "--gin.train.eval_period=20", "--gin.train.multiple_choice=[@MultipleChoiceEval()]",
                       f"--gin.MultipleChoiceEval.path='{choices}'",
                       "--gin.train.sample_prompt=['def ', 'class ']", "--gin.train.sample_max_new_tokens=8",
                       "--gin.PROFILE_STEPS=(5, 8)")
        (target / "stdout.txt").write_text(result.stdout)
        (target / "result.txt").write_text(f"{result.returncode}\n{result.stderr[-3000:]}")

    target = _built_once(tmp_path_factory, "trained_run", build)
    code, _, stderr = (target / "result.txt").read_text().partition("\n")
    assert code == "0", stderr
    return target / "run", (target / "stdout.txt").read_text()


@pytest.fixture
def small_tmpfs(tmp_path):
    """`mount(size)`: a fresh tmpfs of `size` ('600k') to fill, unmounted afterwards; the test is
    skipped where mounting is refused (it needs root)."""
    import subprocess

    mounted = []

    def mount(size: str) -> Path:
        mount_point = tmp_path / f"disk{len(mounted)}"
        mount_point.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                                capture_output=True, text=True)
        if result.returncode:
            pytest.skip(f"cannot mount a small tmpfs to fill ({result.stderr.strip()}); needs root")
        mounted.append(mount_point)
        return mount_point

    yield mount
    for mount_point in mounted:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


S3_BUCKET = "t5x-lite-test"


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 on a free 127.0.0.1 port, with fake credentials in the environment; stopped after."""
    import boto3
    import s3fs
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as env:
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                           "AWS_ENDPOINT_URL": endpoint}.items():
            env.setenv(key, value)
        s3fs.S3FileSystem.clear_instance_cache()
        boto3.client("s3").create_bucket(Bucket=S3_BUCKET)
        try:
            yield endpoint
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
            server.stop()


@pytest.fixture(scope="module")
def gcs_server(tmp_path_factory):
    """A GCS emulator (tests/gcs_emulator.py) on a free 127.0.0.1 port, with a bucket
    gcs_emulator.BUCKET, and the environment pointing gs:// at it; stopped after."""
    from tests import gcs_emulator

    with gcs_emulator.running(tmp_path_factory.mktemp("gcs") / "emulator.log") as url, \
            pytest.MonkeyPatch.context() as env:
        for key, value in gcs_emulator.environment(url).items():
            env.setenv(key, value)
        # gcsfs instances made for another emulator (etils.epath's, through fsspec) keep its address.
        from gcsfs.core import GCSFileSystem

        GCSFileSystem.clear_instance_cache()
        try:
            yield url
        finally:
            GCSFileSystem.clear_instance_cache()


def pytest_collection_finish(session):
    """bench/common.py turns JAX's persistent cache off when the bench tests import it (its timings
    must be real compiles): on again for the tests that run in this process, unless turned off here."""
    jax = sys.modules.get("jax")
    off = os.environ.get("JAX_ENABLE_COMPILATION_CACHE", "").lower() in ("0", "false")
    if jax is not None and "JAX_COMPILATION_CACHE_DIR" in os.environ and not off \
            and not jax.config.jax_enable_compilation_cache:
        from jax.experimental.compilation_cache import compilation_cache

        jax.config.update("jax_enable_compilation_cache", True)
        compilation_cache.reset_cache()  # forget a "cache off" noted by a compile while it was off


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):  # the controller, after every worker has finished
        shutil.rmtree(os.environ["T5X_LITE_TEST_COMPILATION_CACHE"], ignore_errors=True)


# `make test-fast` runs the tests that start no subprocess (-m "not subprocess"): a test is marked
# `subprocess` when its own code or one of its fixtures (built once or not) calls the CLI helpers
# or the subprocess module.
_STARTS_A_PROCESS = re.compile(r"\b(run_cli|start_cli|prepare_stdlib_subset|_prepared_once|subprocess\.\w+|"
                               r"cli_helpers\.train|multiprocessing|mp\.get_context)\b")


def _starts_a_process(fn, module_imports_cli_train: bool) -> bool:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return bool(_STARTS_A_PROCESS.search(source) or (module_imports_cli_train and re.search(r"\btrain\(", source)))


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module
        imports_train = getattr(module, "train", None) is getattr(sys.modules.get("tests.cli_helpers"), "train", 0)
        functions = [item.function]
        for defs in item._fixtureinfo.name2fixturedefs.values():  # noqa: SLF001 - pytest has no public API for this
            functions.extend(d.func for d in defs)
        # A module's own helpers that start processes count for the tests of that module that call them.
        helpers = {name: obj for name, obj in vars(module).items()
                   if inspect.isfunction(obj) and obj.__module__ == module.__name__ and not name.startswith("test")}
        source = inspect.getsource(item.function) if inspect.isfunction(item.function) else ""
        functions.extend(fn for name, fn in helpers.items() if re.search(rf"\b{name}\(", source))
        if any(_starts_a_process(fn, imports_train) for fn in functions):
            item.add_marker(pytest.mark.subprocess)
