"""Where a model directory's lease lives (see lease.py): a local file, an s3 or a gs:// object.

Each store reads the lease with a token (an s3 ETag, a gs:// generation; empty locally) and changes it only if it
is still the one expected: `create` (only where none exists), `replace` (renewal, take-over),
`remove`. Local: a hard link of a complete temp file (O_EXCL where links are unsupported) creates
the file; `replace` and `remove` compare the run id under a mutex file (`lease.json.takeover`),
created the same way and broken when its creator is dead. Beside the lease, the holder keeps an
flock on `lease.<run_id>.lock` for its life. s3: botocore's conditional requests (If-None-Match,
If-Match). gs://: generation preconditions (ifGenerationMatch: 0 to create, the generation read
to renew, take over or remove; the token is the generation).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import os
import socket
import time
import uuid

from t5x_lite import storage
from t5x_lite.storage import gcs_objects

LEASE_FILE = "lease.json"
MUTEX_SUFFIX = ".takeover"
DEFAULT_TTL_S = 120.0
_MUTEX_WAIT_S = 45.0  # a mutex is held for milliseconds; past _MUTEX_STALE_S its holder is presumed dead
_MUTEX_STALE_S = 30.0


class CorruptLeaseError(storage.StorageError):
    """The lease file is not a lease (unlock --force removes it)."""


def _ago(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    return f"{seconds / 60:.0f} min ago" if seconds < 7200 else f"{seconds / 3600:.1f} h ago"


@dataclasses.dataclass(frozen=True)
class LeaseInfo:
    """Who holds a lease. `ttl_s` is the holder's own (it renews every ttl/3); `pid_start` is its
    process's start time in clock ticks since boot (/proc/<pid>/stat), None where unknown."""

    host: str
    pid: int
    started: float
    renewed: float
    run_id: str
    path: str
    ttl_s: float = DEFAULT_TTL_S
    pid_start: int | None = None

    def describe(self) -> str:
        """'pid 1234 on host h, started 2026-11-25 19:40:01 UTC, renewed 3 s ago'."""
        started = datetime.datetime.fromtimestamp(self.started, datetime.timezone.utc)
        return (f"pid {self.pid} on host {self.host}, started {started:%Y-%m-%d %H:%M:%S} UTC, "
                f"renewed {_ago(time.time() - self.renewed)}")

    def to_json(self) -> str:
        fields = dataclasses.asdict(self)
        del fields["path"]
        return json.dumps(fields, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, path: str) -> LeaseInfo:
        try:
            d = json.loads(text)
            info = cls(host=str(d["host"]), pid=int(d["pid"]), started=float(d["started"]),
                       renewed=float(d["renewed"]), run_id=str(d["run_id"]), path=path,
                       ttl_s=float(d.get("ttl_s", DEFAULT_TTL_S)),
                       pid_start=None if d.get("pid_start") is None else int(d["pid_start"]))
            if not info.run_id.isalnum() or info.pid <= 0:
                raise ValueError(f"bad run_id {info.run_id!r} or pid {info.pid}")
            return info
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            model_dir = path.rsplit("/", 1)[0] if storage.is_url(path) else os.path.dirname(path)
            raise CorruptLeaseError(
                f"{path} is not a lease file ({type(e).__name__}: {e}); if no run is writing {model_dir}, "
                f"`t5x-lite checkpoint unlock {model_dir} --force` removes it") from None


def pid_status(pid: int, pid_start: int | None) -> str | None:
    """'same' (running, the same process), 'alive' (running, start unknown), 'gone', None (cannot tell)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        pass  # another user's process: it exists
    except (OSError, ValueError, OverflowError):
        return None
    stat = proc_stat(pid)
    if stat is None:
        return "alive"
    state, start = stat
    if state in ("Z", "X"):  # a zombie has exited; only its parent has not reaped it yet
        return "gone"
    if pid_start is None:
        return "alive"
    return "same" if start == pid_start else "gone"  # a different start: the pid was reused


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in ticks since boot) from /proc/<pid>/stat, None without /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def flock_held(path: str) -> bool | None:
    """Whether a process holds the (exclusive) flock of a run on `path`; None when the file or flock
    is not there.

    Probed with a shared lock: runs judging the same lease at the same moment each probe it, and an
    exclusive probe would see the other's probe as a holder.
    """
    try:
        import fcntl
        fd = os.open(path, os.O_RDONLY)
    except (ImportError, OSError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)


def lock_path(info: LeaseInfo) -> str:
    return os.path.join(os.path.dirname(info.path), f"lease.{info.run_id}.lock")



class LocalStore:
    """A lease file on a local (or NFS) filesystem."""

    def __init__(self, model_dir: str):
        self.dir = storage.absolute(model_dir)
        self.path = os.path.join(self.dir, LEASE_FILE)
        self.mutex = self.path + MUTEX_SUFFIX

    def prepare(self) -> None:
        os.makedirs(self.dir, exist_ok=True)

    def _write_temp(self, text: str, beside: str) -> str:
        tmp = f"{beside}.{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def _sync_dir(self) -> None:
        with contextlib.suppress(OSError):
            fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _create_exclusive(self, path: str, text: str) -> bool:
        """Creates `path` holding `text` unless it exists; a complete file appears at once (a hard link)."""
        tmp = self._write_temp(text, path)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as e:  # a filesystem without hard links: O_EXCL, then the content
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
                raise
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            try:
                os.write(fd, text.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        self._sync_dir()
        return True

    def _read_text(self, path: str) -> str | None:
        try:
            with open(path) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def read(self) -> tuple[LeaseInfo, str] | None:
        while True:
            text = self._read_text(self.path)
            if text is None:
                return None
            try:
                return LeaseInfo.from_json(text, self.path), ""
            except CorruptLeaseError:  # only an O_EXCL create, seen half-written, is young: wait for it
                with contextlib.suppress(FileNotFoundError):
                    if time.time() - os.stat(self.path).st_mtime > 1.0:
                        raise
                time.sleep(0.05)

    def create(self, info: LeaseInfo) -> str | None:
        return "" if self._create_exclusive(self.path, info.to_json()) else None

    @contextlib.contextmanager
    def _mutexed(self):
        """Holds `lease.json.takeover` (created exclusively) while the lease is changed in place."""
        me = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex,
                         "pid_start": (proc_stat(os.getpid()) or (None, None))[1], "created": time.time()})
        deadline = time.monotonic() + _MUTEX_WAIT_S
        while not self._create_exclusive(self.mutex, me):
            holder = self._read_text(self.mutex)
            try:
                held = json.loads(holder) if holder else None
            except ValueError:
                held = None
            if held is not None and self._stale_mutex(held):
                self._break_mutex(held)
            elif time.monotonic() > deadline:
                raise storage.StorageError(
                    f"{self.mutex} has been held for {_MUTEX_WAIT_S:.0f} s ({holder!r}); if no run is starting "
                    "or stopping in that directory, delete it")
            else:
                time.sleep(0.01)
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.mutex)

    def _stale_mutex(self, held) -> bool:
        """Whether the mutex was left by a dead process (this host) or is older than any change takes."""
        try:
            if held["host"] == socket.gethostname() and pid_status(int(held["pid"]), held["pid_start"]) == "gone":
                return True
            return time.time() - float(held["created"]) > _MUTEX_STALE_S
        except (KeyError, TypeError, ValueError):
            return True  # not a mutex this module wrote

    def _break_mutex(self, held: dict) -> None:
        moved = f"{self.mutex}.{uuid.uuid4().hex}.stale"
        try:
            os.rename(self.mutex, moved)
        except FileNotFoundError:
            return
        text = self._read_text(moved) or ""
        if held.get("token") not in text:  # a newer mutex replaced the stale one meanwhile: put it back
            with contextlib.suppress(FileExistsError):
                os.link(moved, self.mutex)
        os.remove(moved)

    def replace(self, expected: LeaseInfo, token: str, new: LeaseInfo) -> str | None:
        with self._mutexed():
            current = self.read()
            if current is None or current[0].run_id != expected.run_id:
                return None
            os.replace(self._write_temp(new.to_json(), self.path), self.path)
            self._sync_dir()
        return ""

    def remove(self, expected: LeaseInfo | None, token: str) -> bool:
        with self._mutexed():
            if expected is not None:
                current = self.read()
                if current is None or current[0].run_id != expected.run_id:
                    return False
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
            self._sync_dir()
        return True

    def hold_lock(self, run_id: str) -> tuple[str, int] | None:
        """An flock on `lease.<run_id>.lock`, held until `drop_lock`; None where flock is unsupported."""
        try:
            import fcntl
        except ImportError:
            return None
        path = os.path.join(self.dir, f"lease.{run_id}.lock")
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            os.remove(path)
            return None
        return path, fd

    def drop_lock(self, lock: tuple[str, int] | None) -> None:
        if lock is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(lock[0])
            os.close(lock[1])  # closing the last descriptor releases the flock

    def cleanup(self, info: LeaseInfo) -> None:
        with contextlib.suppress(OSError):
            os.remove(lock_path(info))


class _ConditionUnsupported(storage.StorageError):
    """The store rejected a conditional request it does not implement."""


class S3Store:
    """A lease object on s3, changed only by conditional writes (If-None-Match / If-Match on the ETag)."""

    def __init__(self, model_dir: str):
        self.path = storage.join(model_dir.rstrip("/"), LEASE_FILE)
        self.bucket, self.key = self.path[len(storage.S3_PREFIX):].split("/", 1)
        self._client = None

    def prepare(self) -> None:
        pass

    def _call(self, method: str, **kwargs):
        """Calls botocore; a failed condition (412, 409) or a missing key returns None."""
        import botocore.session
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

        try:
            if self._client is None:
                self._client = botocore.session.get_session().create_client("s3")
            return getattr(self._client, method)(Bucket=self.bucket, Key=self.key, **kwargs)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (409, 412) or code in ("NoSuchKey", "PreconditionFailed", "ConditionalRequestConflict"):
                return None
            if status == 501 or code == "NotImplemented":
                raise _ConditionUnsupported(f"{self.path}: {code}") from None
            if code == "NoSuchBucket":
                message = f"bucket s3://{self.bucket} does not exist"
            else:
                message = f"{code}: {e.response.get('Error', {}).get('Message', e)}"
            raise storage.StorageError(f"Cannot reach {self.path}: {message}") from None
        except (NoCredentialsError, PartialCredentialsError) as e:
            raise storage.StorageError(
                f"Cannot reach {self.path}: {e}. Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), "
                "and AWS_ENDPOINT_URL for an S3-compatible store.") from None
        except BotoCoreError as e:
            raise storage.StorageError(f"Cannot reach {self.path}: {e}") from None

    def read(self) -> tuple[LeaseInfo, str] | None:
        response = self._call("get_object")
        if response is None:
            return None
        with contextlib.closing(response["Body"]) as body:
            return LeaseInfo.from_json(body.read().decode(), self.path), response["ETag"]

    def _put(self, info: LeaseInfo, **condition) -> str | None:
        response = self._call("put_object", Body=info.to_json().encode(), ContentType="application/json", **condition)
        if response is None:
            return None
        current = self.read()  # a store that ignored the condition shows here whose write won
        return current[1] if current is not None and current[0].run_id == info.run_id else None

    def create(self, info: LeaseInfo) -> str | None:
        return self._put(info, IfNoneMatch="*")

    def replace(self, expected: LeaseInfo, token: str, new: LeaseInfo) -> str | None:
        return self._put(new, IfMatch=token)

    def remove(self, expected: LeaseInfo | None, token: str) -> bool:
        if not token:
            return self._call("delete_object") is not None
        try:
            return self._call("delete_object", IfMatch=token) is not None
        except _ConditionUnsupported:  # a store without conditional deletes: compare, then delete
            current = self.read()
            return current is not None and current[1] == token and self._call("delete_object") is not None

    def hold_lock(self, run_id: str) -> None:
        return None

    def drop_lock(self, lock: None) -> None:
        pass

    def cleanup(self, info: LeaseInfo) -> None:
        pass


class GcsStore:
    """A lease object on gs://, changed only under generation preconditions: created if absent
    (ifGenerationMatch=0), renewed, taken over and removed only at the generation read (the token)."""

    def __init__(self, model_dir: str):
        self.path = storage.join(model_dir.rstrip("/"), LEASE_FILE)
        self._object = gcs_objects.GcsObject(self.path)

    def prepare(self) -> None:
        pass

    def read(self) -> tuple[LeaseInfo, str] | None:
        current = self._object.read()
        if current is None:
            return None
        return LeaseInfo.from_json(current[0].decode(), self.path), str(current[1])

    def _confirmed(self, info: LeaseInfo) -> str | None:
        """The lease's token if it now holds `info`: a write whose reply was lost and whose retry
        then failed its precondition may still have been ours."""
        current = self.read()
        return current[1] if current is not None and current[0].run_id == info.run_id else None

    def create(self, info: LeaseInfo) -> str | None:
        generation = self._object.create(info.to_json().encode())
        return str(generation) if generation is not None else self._confirmed(info)

    def replace(self, expected: LeaseInfo, token: str, new: LeaseInfo) -> str | None:
        generation = self._object.replace(new.to_json().encode(), int(token))
        return str(generation) if generation is not None else self._confirmed(new)

    def remove(self, expected: LeaseInfo | None, token: str) -> bool:
        return self._object.delete(int(token) if token else None)

    hold_lock, drop_lock, cleanup = S3Store.hold_lock, S3Store.drop_lock, S3Store.cleanup


def store_for(model_dir: str):
    if storage.is_s3(model_dir):
        return S3Store(model_dir)
    if storage.is_gcs(model_dir):
        return GcsStore(model_dir)
    if storage.is_url(model_dir):
        raise storage.StorageError(f"{model_dir!r}: a model directory is local, gs:// or s3://.")
    return LocalStore(model_dir)


@contextlib.contextmanager
def storage_errors(model_dir: str):
    """A local OSError (permissions, a read-only disk) as a one-line StorageError."""
    try:
        yield
    except storage.StorageError:
        raise
    except OSError as e:
        raise storage.StorageError(f"Cannot use the lease of {model_dir}: {e}") from None
