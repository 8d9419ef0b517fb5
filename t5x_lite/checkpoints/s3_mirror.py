"""`s3://` model directories: the run works in a local staging copy that is uploaded to s3.

Orbax writes arrays through TensorStore's file and GCS drivers and its metadata through
etils.epath, which uses TensorFlow's filesystems whenever TensorFlow is importable; and
TensorFlow 2.21 has no s3 filesystem. So for `s3://` the run writes everything (checkpoints,
config.gin, vocab/, tb/) under a local staging directory and this module uploads it with s3fs:

    s3://bucket/run/checkpoints/<step>/...          every file Orbax wrote for the step
    s3://bucket/run/checkpoints/<step>/COMMITTED    uploaded last

A step without COMMITTED is an upload that did not finish; it is never listed or restored, so
a save is visible only once complete. Resuming on another machine downloads the step first.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import tempfile
import time

from t5x_lite import storage

COMMIT_MARKER = "COMMITTED"
CHECKPOINTS = "checkpoints"
# Files beside the checkpoints that are uploaded with each step (paths relative to the run).
SIDE_FILES = ("config.gin", "vocab", "tb")


def staging_dir_for(remote_dir: str) -> str:
    """The local staging directory of `remote_dir` ($T5X_LITE_STAGING_DIR, else under the temp dir)."""
    root = os.environ.get("T5X_LITE_STAGING_DIR") or os.path.join(tempfile.gettempdir(), "t5x_lite_staging")
    name = hashlib.sha256(remote_dir.rstrip("/").encode()).hexdigest()[:16]
    return os.path.join(root, name)


class S3Mirror:
    """Uploads finished local checkpoints of a run to s3 (the Checkpointer calls `upload` from its
    finishing thread, one step at a time)."""

    def __init__(self, remote_dir: str, *, read_only: bool = False):
        self.remote_dir = remote_dir.rstrip("/")
        # A reader downloads the steps it reads into a staging directory of its own, so that it
        # never touches the files of a trainer staging the same run on this machine.
        self.local_dir = staging_dir_for(self.remote_dir) + (f".reader-{os.getpid()}" if read_only else "")
        os.makedirs(os.path.join(self.local_dir, CHECKPOINTS), exist_ok=True)
        self._uploaded_side: dict[str, tuple[int, float]] = {}

    def _remote_step(self, step: int) -> str:
        return storage.join(self.remote_dir, CHECKPOINTS, str(step))

    def local_step_dir(self, step: int) -> str:
        return os.path.join(self.local_dir, CHECKPOINTS, str(step))

    def committed_steps(self) -> list[int]:
        """Steps whose upload finished (their COMMITTED marker exists), ascending."""
        markers = storage.glob(storage.join(self.remote_dir, CHECKPOINTS, "*", COMMIT_MARKER))
        steps = []
        for marker in markers:
            name = posixpath.basename(posixpath.dirname(marker))
            if name.isdigit():
                steps.append(int(name))
        return sorted(steps)

    def saved_metadata(self, step: int) -> dict:
        """The metadata item (JSON) of a committed step, read from s3 without fetching the step."""
        with storage.open(storage.join(self._remote_step(step), "metadata", "metadata"), "r") as f:
            return json.load(f)

    def fetch(self, step: int) -> None:
        """Makes the local staging copy of `step` complete, downloading it when absent."""
        local = self.local_step_dir(step)
        if os.path.isdir(local):
            return
        partial = f"{local}.download-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        prefix = self._remote_step(step)
        for path in storage.walk_files(prefix):
            relative = path[len(prefix) + 1:]
            if relative == COMMIT_MARKER:
                continue
            target = os.path.join(partial, *relative.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            storage.copy(path, target)
        os.replace(partial, local)

    def drop_uncommitted_local_steps(self, committed: list[int]) -> None:
        """Removes staged steps that never reached s3 (a run killed before their upload finished)."""
        root = os.path.join(self.local_dir, CHECKPOINTS)
        for name in os.listdir(root):
            if not (name.isdigit() and int(name) in committed):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)

    def upload(self, step: int) -> None:
        """Uploads the finished local `step`, the side files, then its COMMITTED marker."""
        local = self.local_step_dir(step)
        remote = self._remote_step(step)
        if storage.exists(remote):  # the remains of an unfinished or damaged earlier upload
            storage.remove_tree(remote)
        for root, _, files in os.walk(local):
            for name in files:
                path = os.path.join(root, name)
                storage.copy(path, storage.join(remote, *os.path.relpath(path, local).split(os.sep)))
        self._upload_side_files()
        with storage.open(storage.join(remote, COMMIT_MARKER), "w") as f:
            f.write(f"step {step} uploaded {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")

    def _upload_side_files(self) -> None:
        """config.gin, vocab/ and tb/: each file whose size or mtime changed since its last upload."""
        for side in SIDE_FILES:
            base = os.path.join(self.local_dir, side)
            paths = [base] if os.path.isfile(base) else [
                os.path.join(root, name) for root, _, names in os.walk(base) for name in names]
            for path in paths:
                stat = os.stat(path)
                if self._uploaded_side.get(path) == (stat.st_size, stat.st_mtime):
                    continue
                relative = os.path.relpath(path, self.local_dir).split(os.sep)
                storage.copy(path, storage.join(self.remote_dir, *relative))
                self._uploaded_side[path] = (stat.st_size, stat.st_mtime)

    def delete_step(self, step: int) -> None:
        """Deletes a committed step on s3: its marker first, so it is never listed half-deleted."""
        remote = self._remote_step(step)
        storage.remove(storage.join(remote, COMMIT_MARKER))
        storage.remove_tree(remote)

    def forget(self, step: int) -> None:
        """Drops the staged copy of a step that was moved away on s3."""
        shutil.rmtree(self.local_step_dir(step), ignore_errors=True)
