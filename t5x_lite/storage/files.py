"""File operations on paths that may be local, `gs://...` or `s3://...`.

Local paths go through the standard library; `gs://` and `s3://` through their fsspec
filesystems (object_stores.py: gcsfs and s3fs), so no path needs TensorFlow.
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

from t5x_lite.storage import object_stores
from t5x_lite.storage.object_stores import GCS_PREFIX, S3_PREFIX, StorageError

_CHUNK_BYTES = 8 << 20


def is_url(path: str) -> bool:
    """Whether `path` names a remote object store (`scheme://...`) rather than a local file."""
    return "://" in path


def is_s3(path: str) -> bool:
    """Whether `path` is an `s3://` URL."""
    return path.startswith(S3_PREFIX)


def is_gcs(path: str) -> bool:
    """Whether `path` is a `gs://` URL."""
    return path.startswith(GCS_PREFIX)


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


def _remote(path: str, operation: str, *args, **kwargs):
    """Calls the fsspec `operation` of `path`'s object store, its failures as one-line StorageErrors."""
    fs = object_stores.call(path, object_stores.filesystem, path)
    return object_stores.call(path, getattr(fs, operation), *args, **kwargs)


def _with_scheme(path: str, found: list[str]) -> list[str]:
    """fsspec's scheme-less results (`bucket/key`) in `path`'s form (`gs://bucket/key`)."""
    scheme = path.split("://", 1)[0] + "://"
    return sorted(p if "://" in p else scheme + p for p in found)


def check_bucket(path: str) -> None:
    """StorageError naming the fix when the bucket of URL `path` does not exist or cannot be
    reached (credentials, endpoint); nothing for local paths."""
    if not is_url(path):
        return
    bucket = bucket_of(path)
    try:
        _remote(path, "info", bucket)  # unlike `exists`, an endpoint that does not answer raises
    except FileNotFoundError:
        where = object_stores.gcs_endpoint() if is_gcs(path) else object_stores.s3_endpoint()
        raise StorageError(f"Bucket {bucket} of {path!r} does not exist (at {where}) or these credentials cannot "
                           "see it; create it, or fix the name or the credentials.") from None


def exists(path: str) -> bool:
    """Whether a file or directory (for s3, an object or a prefix holding objects) exists."""
    return _remote(path, "exists", path) if is_url(path) else os.path.exists(path)


def glob(pattern: str) -> list[str]:
    """The paths matching a glob `pattern`, sorted, in the same form (scheme kept)."""
    if is_url(pattern):
        return _with_scheme(pattern, _remote(pattern, "glob", pattern))
    return sorted(globbing.glob(pattern))


def listdir(path: str) -> list[str]:
    """Names (not paths) of the entries directly inside directory `path`, sorted."""
    if is_url(path):
        entries = _remote(path, "ls", path, detail=False)
        return sorted(posixpath.basename(e.rstrip("/")) for e in entries)
    return sorted(os.listdir(path))


def makedirs(path: str) -> None:
    """Creates directory `path` and its parents; nothing to do on object stores, which have none."""
    if not is_url(path):
        os.makedirs(path, exist_ok=True)


def open(path: str, mode: str = "rb") -> IO:  # noqa: A001 - the module's own open
    """A file object for `path` in `mode` ('r', 'rb', 'w', 'wb')."""
    if is_url(path):
        return _remote(path, "open", path, mode, block_size=_CHUNK_BYTES)
    return builtins.open(path, mode, encoding=None if "b" in mode else "utf-8")


def read_ranges(paths: list[str], starts: list[int], ends: list[int | None]) -> list[bytes]:
    """The bytes [start, end) of each file (`end` None: to the end of the file). On an object store
    the ranges are requested concurrently, each exactly its bytes; URLs must share one scheme."""
    if paths and is_url(paths[0]):
        return _remote(paths[0], "cat_ranges", list(paths), list(starts), list(ends), on_error="raise")
    out = []
    for path, start, end in zip(paths, starts, ends):
        with builtins.open(path, "rb") as f:
            f.seek(start)
            out.append(f.read() if end is None else f.read(end - start))
    return out


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
    if is_url(path):
        _remote(path, "rm_file", path)
    else:
        os.remove(path)


def walk_files(path: str) -> list[str]:
    """Every file under directory `path` (recursively), as full paths in `path`'s form, sorted."""
    if is_url(path):
        return _with_scheme(path, _remote(path, "find", path))
    return sorted(os.path.join(root, name) for root, _, names in os.walk(path) for name in names)


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
    """Deletes directory `path` and everything under it (on object stores, every object under the prefix)."""
    if is_url(path):
        if _remote(path, "exists", path):
            _remote(path, "rm", path, recursive=True)
    elif os.path.exists(path):
        shutil.rmtree(path)


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
    info = _remote(path, "info", path)
    version = hashlib.sha256(f"{path}|{info.get('ETag')}|{info.get('size')}".encode()).hexdigest()
    local = os.path.join(tempfile.gettempdir(), "t5x_lite_s3", version[:20], posixpath.basename(path))
    if not os.path.exists(local):
        os.makedirs(os.path.dirname(local), exist_ok=True)
        partial = f"{local}.{os.getpid()}.tmp"
        copy(path, partial)
        os.replace(partial, local)
    return local
