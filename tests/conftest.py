"""Test set-up: 8 host-platform CPU devices, set before JAX is imported anywhere."""

import os
import shutil
import socket
import tempfile
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# CLI subprocesses of one test run share compiled programs through JAX's persistent cache
# (many whole-run tests compile the same tiny train step); the controller deletes it at the end.
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
os.environ.setdefault("T5X_LITE_TEST_COMPILATION_CACHE",
                      os.path.join(tempfile.gettempdir(), "t5x_lite_test_compilation_cache", _RUN_ID))

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


import pytest  # noqa: E402 (after the environment is set)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """The stdlib's json and urllib packages prepared with a 512-piece vocabulary."""
    from tests.cli_helpers import prepare_stdlib_subset

    return prepare_stdlib_subset(tmp_path_factory.mktemp("data") / "tiny", ["json", "urllib"])


@pytest.fixture(scope="session")
def small_data_dir(tmp_path_factory):
    """Only the stdlib's json package: small enough for whole epochs in a test."""
    from tests.cli_helpers import prepare_stdlib_subset

    return prepare_stdlib_subset(tmp_path_factory.mktemp("data") / "small", ["json"])


@pytest.fixture(scope="session")
def trained_run(data_dir, tmp_path_factory):
    """(model directory, losses) of a tiny run trained for 8 steps: a run to start others from
    or to point at. Read it only (copy it to change it)."""
    from tests.cli_helpers import losses, train

    model_dir = tmp_path_factory.mktemp("trained") / "run"
    result = train(data_dir, model_dir, "--gin.TRAIN_STEPS=8", "--gin.train.log_period=1",
                   "--gin.OptimizerConfig.warmup_steps=1")
    assert result.returncode == 0, result.stderr[-3000:]
    return model_dir, losses(result.stdout)


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


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):  # the controller, after every worker has finished
        shutil.rmtree(os.environ["T5X_LITE_TEST_COMPILATION_CACHE"], ignore_errors=True)
