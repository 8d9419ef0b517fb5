"""Test set-up: 8 host-platform CPU devices, set before JAX is imported anywhere."""

import os
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
