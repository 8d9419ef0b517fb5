"""One gs:// object changed only under GCS generation preconditions: created only if absent
(`ifGenerationMatch=0`), replaced or deleted only if its generation is still the one read.

GCS applies each precondition atomically on the server, so of two writers racing exactly one
wins; the model directory's lease (checkpoints/lease_store.py) is built on this. Requests go
through google-cloud-storage's JSON API client, to $STORAGE_EMULATOR_HOST when it is set.
"""

from __future__ import annotations

import threading
from typing import Any

from t5x_lite.storage.object_stores import GCS_CREDENTIALS_FIX, GCS_PREFIX, StorageError, emulator_url, gcs_endpoint

FAILED = object()  # what GcsObject._call returns for a failed precondition or a missing object
_clients: dict[tuple[int, str | None], Any] = {}
_clients_lock = threading.Lock()


def _client():
    """A google-cloud-storage client per process (anonymous on an emulator)."""
    import os

    from google.cloud import storage as gcs  # only gs:// leases need it

    key = (os.getpid(), emulator_url())  # a forked process, or another emulator: a new client
    with _clients_lock:
        if key not in _clients:
            if key[1]:
                _clients[key] = gcs.Client.create_anonymous_client()
            else:
                # The project only matters for listing or creating buckets, which this never does.
                _clients[key] = gcs.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or "none")
        return _clients[key]


class GcsObject:
    """The object at gs:// URL `path`."""

    def __init__(self, path: str):
        if not path.startswith(GCS_PREFIX):
            raise ValueError(f"not a gs:// path: {path!r}")
        self.path = path
        self.bucket, self.key = path[len(GCS_PREFIX):].split("/", 1)

    def _blob(self):
        return _client().bucket(self.bucket).blob(self.key)

    def _call(self, fn, *args, upload: bool = False, **kwargs):
        """`fn`'s result; FAILED when a precondition failed or the object does not exist; the
        store's other failures as StorageErrors naming the fix (an upload's 404: no bucket)."""
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth

        try:
            return fn(*args, **kwargs)
        except api.PreconditionFailed:
            return FAILED
        except api.NotFound:
            if upload:
                raise StorageError(f"Cannot reach {self.path}: bucket gs://{self.bucket} does not exist (at "
                                   f"{gcs_endpoint()}); create it, or fix the name.") from None
            return FAILED
        except (api.Unauthorized, api.Forbidden, auth.DefaultCredentialsError, auth.RefreshError) as e:
            raise StorageError(f"Cannot reach {self.path}: {type(e).__name__}: {str(e).splitlines()[0][:200]}. "
                               f"{GCS_CREDENTIALS_FIX}") from None
        except (api.GoogleAPICallError, api.RetryError, OSError) as e:
            raise StorageError(f"Cannot reach {self.path} at {gcs_endpoint()}: {type(e).__name__}: "
                               f"{str(e).splitlines()[0][:200]}") from None

    def read(self) -> tuple[bytes, int] | None:
        """(content, generation), or None when the object does not exist."""
        blob = self._blob()
        data = self._call(blob.download_as_bytes)
        return None if data is FAILED else (data, int(blob.generation))

    def _upload(self, data: bytes, generation: int) -> int | None:
        blob = self._blob()
        done = self._call(blob.upload_from_string, data, content_type="application/json",
                          if_generation_match=generation, upload=True)
        return None if done is FAILED else int(blob.generation)

    def create(self, data: bytes) -> int | None:
        """Writes `data` only if the object does not exist: its generation, or None when it exists.
        (A request retried after a lost reply may report None for its own write: read to tell.)"""
        return self._upload(data, 0)

    def replace(self, data: bytes, generation: int) -> int | None:
        """Writes `data` only if the object is still at `generation`: the new generation, or None."""
        return self._upload(data, generation)

    def delete(self, generation: int | None) -> bool:
        """Deletes the object (only if it is still at `generation`, when one is given); whether it did."""
        return self._call(self._blob().delete, if_generation_match=generation) is not FAILED
