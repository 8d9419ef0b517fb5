"""A local folder that stands in for a gs:// or s3:// log directory: TensorBoard's event files are
appended to locally, and each file that grew is copied up whole (object stores cannot append),
at most once per `period_s` in a background thread and at close, so a remote MODEL_DIR gets
MODEL_DIR/tb/ without TensorFlow's filesystems, without a request per logged step, and without
the train loop ever waiting on the store."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time

from t5x_lite import storage


class RemoteLogdir:
    """`local` mirrors `remote`; `sync()` uploads what changed."""

    def __init__(self, remote: str, *, period_s: float = 30.0):
        self.remote = remote.rstrip("/")
        name = hashlib.sha256(self.remote.encode()).hexdigest()[:16]
        self.local = os.path.join(tempfile.gettempdir(), "t5x_lite_logdirs", f"{name}-{os.getpid()}")
        os.makedirs(self.local, exist_ok=True)
        self._period_s = period_s
        self._last = time.monotonic()
        self._sizes: dict[str, int] = {}
        self._uploading: threading.Thread | None = None
        self.failure: str | None = None  # the last upload's error, if it failed

    def sync(self) -> None:
        """Starts an upload of what changed in a background thread, when `period_s` has passed
        since the last one began and none is running."""
        if time.monotonic() - self._last < self._period_s or (self._uploading and self._uploading.is_alive()):
            return
        self._last = time.monotonic()
        self._uploading = threading.Thread(target=self._upload_quietly, name="tensorboard-upload", daemon=True)
        self._uploading.start()

    def close(self) -> None:
        """Waits for an upload in progress, then uploads what is left (raising its error) and
        removes the local copy."""
        if self._uploading:
            self._uploading.join()
        self._upload()
        shutil.rmtree(self.local, ignore_errors=True)

    def _upload_quietly(self) -> None:
        try:
            self._upload()
        except Exception as e:  # noqa: BLE001 - retried at the next sync; close raises it
            self.failure = f"{type(e).__name__}: {e}"

    def _upload(self) -> None:
        """Copies each local file whose size changed since its last upload."""
        for root, _, names in os.walk(self.local):
            for name in names:
                path = os.path.join(root, name)
                size = os.path.getsize(path)
                if self._sizes.get(path) != size:
                    relative = os.path.relpath(path, self.local).split(os.sep)
                    storage.copy(path, storage.join(self.remote, *relative))
                    self._sizes[path] = size
