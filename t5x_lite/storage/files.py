"""File operations on paths that may be local, `gs://...` or `s3://...`.

Local paths go through the standard library, so checkpoints, leases and manifests on local
disk need no TensorFlow (it stays the data path's). `gs://` goes through `tf.io.gfile`, which
reads it natively. `s3://` goes through fsspec's s3fs: TensorFlow 2.21 has no s3 filesystem without tensorflow-io, and
etils.epath picks TensorFlow's backend whenever TensorFlow is importable. s3fs takes its
credentials, region and endpoint from the usual AWS settings (`AWS_ACCESS_KEY_ID`,
`AWS_PROFILE`, `AWS_ENDPOINT_URL` for S3-compatible stores, ...).
"""

from __future__ import annotations

import builtins
import glob as globbing
import hashlib
import os
import posixpath
import shutil
import tempfile
from typing import IO

from t5x_lite.errors import MissingExtraError, UserError
from t5x_lite.tf_setup import import_tensorflow

S3_PREFIX = "s3://"
_CHUNK_BYTES = 8 << 20


class StorageError(UserError, OSError):
    """A path cannot be reached (missing bucket, no credentials); the message names the fix."""


def is_url(path: str) -> bool:
    """Whether `path` names a remote object store (`scheme://...`) rather than a local file."""
    return "://" in path


def is_s3(path: str) -> bool:
    """Whether `path` is an `s3://` URL (served by s3fs rather than TensorFlow)."""
    return path.startswith(S3_PREFIX)


def absolute(path: str) -> str:
    """`path` made absolute (and `~` expanded) when local; URLs are returned as they are."""
    return path if is_url(path) else os.path.abspath(os.path.expanduser(path))


def nearest_existing(path: str) -> str:
    """The local `path` made absolute, or the nearest of its parent folders that exists: where a
    file or directory made at `path` would land (a relative path climbs to the working directory)."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    return existing


def join(base: str, *names: str) -> str:
    """Joins path components with `/` for URLs and the OS separator for local paths."""
    return posixpath.join(base, *names) if is_url(base) else os.path.join(base, *names)


def _s3():
    """The s3 filesystem; fsspec keeps one instance per process (and makes a new one after a fork)."""
    import s3fs  # s3fs (and aiobotocore) load slowly; only s3:// paths need them

    return s3fs.S3FileSystem()


def _gfile():
    """TensorFlow's tf.io.gfile, which reads gs:// paths; MissingExtraError when it is not installed."""
    try:
        return import_tensorflow().io.gfile
    except ImportError:
        raise MissingExtraError("gs:// paths are read through TensorFlow's tf.io.gfile, and TensorFlow is not "
                                "installed: pip install 't5x-lite[seqio]' (or `make install`), or use a local "
                                "or s3:// path.") from None


def s3_endpoint() -> str:
    """The S3 endpoint s3fs (botocore) uses: AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else AWS's own."""
    return (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            or "AWS's default S3 endpoint")


def _s3_call(path: str, fn, *args, **kwargs):
    """Calls s3fs, turning missing credentials and an endpoint that does not answer into a
    StorageError that names the path, the endpoint and what to set."""
    from botocore import exceptions as boto  # only s3:// paths need it

    try:
        return fn(*args, **kwargs)
    except (boto.NoCredentialsError, boto.PartialCredentialsError) as e:
        raise StorageError(
            f"Cannot reach {path!r}: {e}. Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
            "AWS_PROFILE), and AWS_ENDPOINT_URL for an S3-compatible store."
        ) from None
    except (boto.ConnectionError, boto.HTTPClientError) as e:
        raise StorageError(
            f"Cannot reach {path!r}: the S3 endpoint {s3_endpoint()} does not answer ({type(e).__name__}). "
            "Check AWS_ENDPOINT_URL (an S3-compatible store's address) and the network."
        ) from None


def exists(path: str) -> bool:
    """Whether a file or directory (for s3, an object or a prefix holding objects) exists."""
    if is_s3(path):
        return _s3_call(path, _s3().exists, path)
    return _gfile().exists(path) if is_url(path) else os.path.exists(path)


def glob(pattern: str) -> list[str]:
    """The paths matching a glob `pattern`, sorted, in the same form (scheme kept)."""
    if is_s3(pattern):
        return sorted(S3_PREFIX + p for p in _s3_call(pattern, _s3().glob, pattern))
    return sorted(_gfile().glob(pattern) if is_url(pattern) else globbing.glob(pattern))


def listdir(path: str) -> list[str]:
    """Names (not paths) of the entries directly inside directory `path`, sorted."""
    if is_s3(path):
        entries = _s3_call(path, _s3().ls, path, detail=False)
        return sorted(posixpath.basename(e.rstrip("/")) for e in entries)
    names = _gfile().listdir(path) if is_url(path) else os.listdir(path)
    return sorted(name.rstrip("/") for name in names)


def makedirs(path: str) -> None:
    """Creates directory `path` and its parents; nothing to do on s3, which has no directories."""
    if not is_url(path):
        os.makedirs(path, exist_ok=True)
    elif not is_s3(path):
        _gfile().makedirs(path)


def open(path: str, mode: str = "rb") -> IO:  # noqa: A001 - the module's own open
    """A file object for `path` in `mode` ('r', 'rb', 'w', 'wb')."""
    if is_s3(path):
        return _s3_call(path, _s3().open, path, mode, block_size=_CHUNK_BYTES)
    if is_url(path):
        return _gfile().GFile(path, mode)
    return builtins.open(path, mode, encoding=None if "b" in mode else "utf-8")


def write_whole(path: str, text: str) -> None:
    """Writes text file `path` so that it exists only once complete.

    Locally the text goes to a file beside it (named by the process id, so concurrent writers
    never share one) that is then renamed over `path`; object stores replace an object whole
    on close.
    """
    partial = path if is_url(path) else f"{path}.tmp.{os.getpid()}"
    with open(partial, "w") as f:
        f.write(text)
    if partial != path:
        rename(partial, path)


def remove(path: str) -> None:
    """Deletes file `path`."""
    if is_s3(path):
        _s3_call(path, _s3().rm_file, path)
    elif is_url(path):
        _gfile().remove(path)
    else:
        os.remove(path)


def walk_files(path: str) -> list[str]:
    """Every file under directory `path` (recursively), as full paths in `path`'s form, sorted."""
    if is_s3(path):
        return sorted(S3_PREFIX + p for p in _s3_call(path, _s3().find, path))
    walk = _gfile().walk if is_url(path) else os.walk
    return sorted(join(root, name) for root, _, names in walk(path) for name in names)


def rename(source: str, destination: str) -> None:
    """Moves a file or directory tree (on object stores: copies every object, then deletes)."""
    if not is_url(source):
        os.makedirs(os.path.dirname(destination) or ".", exist_ok=True)
        os.rename(source, destination)
        return
    for path in walk_files(source):
        copy(path, join(destination, path[len(source.rstrip("/")) + 1:]))
    remove_tree(source)


def remove_tree(path: str) -> None:
    """Deletes directory `path` and everything under it (for s3, every object under the prefix)."""
    if is_s3(path):
        if _s3_call(path, _s3().exists, path):
            _s3_call(path, _s3().rm, path, recursive=True)
    elif not is_url(path):
        if os.path.exists(path):
            shutil.rmtree(path)
    elif _gfile().exists(path):
        _gfile().rmtree(path)


def copy(source: str, destination: str) -> None:
    """Copies one file between any two places (local, gs://, s3://), streaming it in chunks."""
    with open(source, "rb") as src, open(destination, "wb") as dst:
        shutil.copyfileobj(src, dst, _CHUNK_BYTES)


def bucket_of(path: str) -> str:
    """`scheme://bucket` of a URL."""
    scheme, rest = path.split("://", 1)
    return f"{scheme}://{rest.split('/', 1)[0]}"


def tensorflow_readable(path: str) -> str:
    """A path that tf.io.gfile (and so seqio's vocabularies) can open with `path`'s content.

    That is `path` itself, except on s3: then a local copy, kept in the temp directory under
    a name that changes when the object does, so each machine downloads it once.
    """
    if not is_s3(path):
        return path
    info = _s3_call(path, _s3().info, path)
    version = hashlib.sha256(f"{path}|{info.get('ETag')}|{info.get('size')}".encode()).hexdigest()
    local = os.path.join(tempfile.gettempdir(), "t5x_lite_s3", version[:20], posixpath.basename(path))
    if not os.path.exists(local):
        os.makedirs(os.path.dirname(local), exist_ok=True)
        partial = f"{local}.{os.getpid()}.tmp"
        copy(path, partial)
        os.replace(partial, local)
    return local
