"""The object stores behind `gs://` and `s3://` paths: one fsspec filesystem per scheme, and their
failures (no credentials, no bucket, an endpoint that does not answer) as one-line StorageErrors.

- `s3://`: s3fs. Credentials, region and endpoint come from the usual AWS settings
  (`AWS_ACCESS_KEY_ID`, `AWS_PROFILE`, `AWS_ENDPOINT_URL` for S3-compatible stores, ...).
- `gs://`: gcsfs, over Google Cloud Storage's JSON API; no TensorFlow. Credentials are Google's
  application default credentials (`GOOGLE_APPLICATION_CREDENTIALS`, `gcloud auth
  application-default login`, or a TPU/GCE VM's service account). `STORAGE_EMULATOR_HOST`
  points every client (gcsfs, google-cloud-storage, and through `configure_environment` Orbax's
  TensorStore and etils.epath) at an emulator instead, without credentials.

`configure_environment` runs when `t5x_lite.storage` is imported, before Orbax first opens a
gs:// path: etils.epath (Orbax's metadata files) then uses gcsfs rather than TensorFlow's
tf.io.gfile, so a checkpoint on gs:// is written the same way whether TensorFlow is installed or not.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from t5x_lite.errors import UserError

S3_PREFIX = "s3://"
GCS_PREFIX = "gs://"
EMULATOR_VARIABLE = "STORAGE_EMULATOR_HOST"


class StorageError(UserError, OSError):
    """A path cannot be reached (missing bucket, no credentials); the message names the fix."""


def emulator_url() -> str | None:
    """The GCS emulator's URL from $STORAGE_EMULATOR_HOST (`host:port` gets `http://`), or None."""
    host = os.environ.get(EMULATOR_VARIABLE, "")
    if host in ("", "default"):
        return None
    return host if host.startswith(("http://", "https://")) else f"http://{host}"


def configure_environment() -> None:
    """Points Orbax's gs:// writers where gcsfs points, before either is first used.

    - `EPATH_USE_TF=false`: etils.epath (Orbax's metadata) reads and writes gs:// through gcsfs.
    - `GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`: gcsfs's plain JSON-API filesystem, which needs no
      gRPC control-plane call per bucket (an emulator does not serve one); without listing cache.
    - With an emulator: TensorStore's GCS driver (Orbax's arrays) goes to it with a placeholder token.

    A value the user set already is kept.
    """
    import fsspec.config

    os.environ.setdefault("EPATH_USE_TF", "false")
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    # No listing cache in the gcsfs that etils.epath makes: a trainer's new steps must show in an
    # evaluator's listing, and a step deleted by retention must not.
    for protocol in ("gs", "gcs"):
        fsspec.config.conf.setdefault(protocol, {}).setdefault("cache_timeout", 0)
    url = emulator_url()
    if url is not None:
        os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", url)
        os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")


def filesystem(path: str) -> Any:
    """The fsspec filesystem that serves `path`'s scheme; StorageError for a scheme none serves.

    fsspec keeps one instance per process and arguments (and makes a new one after a fork).
    """
    if path.startswith(S3_PREFIX):
        import s3fs  # s3fs (and aiobotocore) load slowly; only s3:// paths need them

        return s3fs.S3FileSystem()
    if path.startswith(GCS_PREFIX):
        from gcsfs.core import GCSFileSystem  # the JSON-API filesystem (see configure_environment)

        # Application default credentials or a clear error, never a silent anonymous fallback; no
        # listing cache: other processes (a trainer, its evaluators) change the same prefixes.
        url = emulator_url()  # named, so that fsspec's instance cache keeps one per endpoint
        return GCSFileSystem(token="anon" if url else "google_default", cache_timeout=0, endpoint_url=url)
    raise StorageError(f"{path!r}: only local paths, gs:// and s3:// are supported.")


def s3_endpoint() -> str:
    """The S3 endpoint s3fs (botocore) uses: AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else AWS's own."""
    return (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            or "AWS's default S3 endpoint")


def gcs_endpoint() -> str:
    """Where gs:// requests go: the emulator ($STORAGE_EMULATOR_HOST) or Google Cloud Storage."""
    url = emulator_url()
    return f"the emulator at {url} ({EMULATOR_VARIABLE})" if url else "Google Cloud Storage"


GCS_CREDENTIALS_FIX = ("Set GOOGLE_APPLICATION_CREDENTIALS to a service account key, or run `gcloud auth "
                       f"application-default login` (on a TPU or GCE VM, its service account needs access), or set "
                       f"{EMULATOR_VARIABLE} for an emulator.")
S3_CREDENTIALS_FIX = ("Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL for "
                      "an S3-compatible store.")


def call(path: str, fn: Callable, *args, **kwargs):
    """Calls `fn` (an fsspec operation on `path`), turning missing credentials, a refused request
    and an endpoint that does not answer into a StorageError that names the path and the fix."""
    try:
        return fn(*args, **kwargs)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError, StorageError):
        raise
    except Exception as e:  # noqa: BLE001 - each client raises its own types; they are sorted below
        problem = describe_failure(path, e)
        if problem is None:
            raise
        raise StorageError(f"Cannot reach {path!r}: {problem}") from None


def describe_failure(path: str, error: BaseException) -> str | None:
    """What went wrong and how to fix it, for a client error that means the store cannot be used
    (credentials, permissions, the endpoint); None for any other error."""
    name = type(error).__name__
    text = str(error).split("\n", 1)[0][:300]
    if path.startswith(S3_PREFIX):
        from botocore import exceptions as boto  # only s3:// paths need it

        if isinstance(error, (boto.NoCredentialsError, boto.PartialCredentialsError)):
            return f"{text}. {S3_CREDENTIALS_FIX}"
        if isinstance(error, (boto.ConnectionError, boto.HTTPClientError)):
            return (f"the S3 endpoint {s3_endpoint()} does not answer ({name}). Check AWS_ENDPOINT_URL "
                    "(an S3-compatible store's address) and the network.")
        return None
    if path.startswith(GCS_PREFIX):
        import aiohttp  # gcsfs's transport
        from google.auth import exceptions as auth

        if isinstance(error, auth.DefaultCredentialsError | auth.RefreshError):
            return f"no Google Cloud credentials ({text}). {GCS_CREDENTIALS_FIX}"
        if isinstance(error, aiohttp.ClientConnectionError | TimeoutError | ConnectionError):
            return (f"{gcs_endpoint()} does not answer ({name}). Check the network, or {EMULATOR_VARIABLE} "
                    "for an emulator.")
        if getattr(error, "code", None) in (401, 403) or text.startswith("Forbidden"):  # gcsfs's 403: OSError
            return f"access denied ({text}). {GCS_CREDENTIALS_FIX}"
        return None
    return None
