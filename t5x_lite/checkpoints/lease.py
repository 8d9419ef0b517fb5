"""One writer per model directory: the run that writes MODEL_DIR holds `MODEL_DIR/lease.json`.

The file names its holder (host, pid, start, last renewal, a run id). A second run finds it and
stops with `LeaseHeldError`, unless the holder is dead: then the lease is taken over with a
one-line warning. How a holder is judged (`holder_state`):

- local path, same host: its process (`os.kill(pid, 0)`, its start time from /proc/<pid>/stat)
  and an `fcntl.flock` it holds on `MODEL_DIR/lease.<run_id>.lock` for its whole life (the
  kernel drops it when the process dies, even on kill -9);
- another host, or an object store: its renewals. The holder rewrites `renewed` every ttl/3
  (`Lease.start_renewing`); a lease not renewed for `ttl_s` is expired. Hosts' clocks must agree
  to well within the ttl.

Atomicity: local paths create the file with a hard link of a complete temp file (O_EXCL where
links are unsupported); every other change (renewal, take-over, release, unlock) compares the
run id under a mutex file `lease.json.takeover` created the same way. `s3://` uses conditional
writes: create with `If-None-Match: *`, renew and take over with `If-Match: <ETag>`, remove with
a conditional delete. `gs://` uses generation preconditions: create with `ifGenerationMatch=0`,
renew, take over and remove with `ifGenerationMatch=<generation read>`. On both stores the server
decides which of two racing writes wins.

Several processes: only the chief (jax process 0) should acquire the lease; the caller decides.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import threading
import time
import uuid
from typing import Callable, Sequence

from t5x_lite import errors, storage
from t5x_lite.checkpoints.lease_store import (
                                              DEFAULT_TTL_S,
                                              LEASE_FILE,
                                              CorruptLeaseError,
                                              LeaseInfo,
                                              flock_held,
                                              lock_path,
                                              pid_status,
                                              proc_stat,
                                              storage_errors,
                                              store_for,
)
from t5x_lite.errors import UserError

__all__ = ["DEFAULT_TTL_S", "LEASE_FILE", "Lease", "LeaseHeldError", "LeaseInfo", "LeaseLostError", "holder_state",
           "read_lease", "unlock", "unlock_main"]
_ATTEMPTS = 20


class LeaseHeldError(UserError):
    """Another live run holds the model directory."""


class LeaseLostError(UserError):
    """This run's lease was removed or taken by another run: it must stop writing."""


def _judge(info: LeaseInfo, ttl_s: float | None = None) -> tuple[str, str]:
    """(state, why): 'live', 'dead' or 'unknown', and a clause saying why."""
    ttl = info.ttl_s if ttl_s is None else ttl_s
    if not storage.is_url(info.path) and info.host == socket.gethostname():
        pid = pid_status(info.pid, info.pid_start)
        locked = flock_held(lock_path(info))
        if pid == "gone":
            if locked:
                return "unknown", (f"its process is gone but its lock {lock_path(info)} is still held, "
                                   "perhaps by a process it started")
            return "dead", "its process is gone"
        if locked is False and pid != "same":
            return "dead", "its lock was released, so its process exited (the pid now names another process)"
        if locked is False:
            return "unknown", f"its process is running but does not hold its lock {lock_path(info)}"
        if pid is not None or locked:
            return "live", "its process is running"
    age = time.time() - info.renewed
    if age <= ttl:
        return "live", f"it expires unless renewed within {ttl:.0f} s"
    return "dead", f"its renewals stopped {age:.0f} s ago, more than its ttl of {ttl:.0f} s"


def holder_state(info: LeaseInfo, *, ttl_s: float | None = None) -> str:
    """'live', 'dead' or 'unknown' (conflicting signs: never taken over without --force).

    `ttl_s` defaults to the holder's own (`info.ttl_s`), the period it promised to renew within.
    """
    return _judge(info, ttl_s)[0]


def read_lease(model_dir: str) -> LeaseInfo | None:
    """The lease held on `model_dir`, or None; never writes."""
    with storage_errors(model_dir):
        current = store_for(model_dir).read()
    return None if current is None else current[0]


def live_holder(model_dir: str) -> LeaseInfo | None:
    """The lease's holder when it is live or cannot be judged ('unknown'): a trainer that may be
    writing `model_dir` now; None when no lease is held or its holder is dead. Never writes."""
    holder = read_lease(model_dir)
    return holder if holder is not None and holder_state(holder) in ("live", "unknown") else None


def _print_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


class Lease:
    """This run's lease on a model directory: `acquire`, `start_renewing`, `check` now and then, `release`."""

    def __init__(self, store, info: LeaseInfo, lock, taken_over: LeaseInfo | None):
        self._store, self._info, self._lock = store, info, lock
        self.taken_over = taken_over  # the dead run's lease this one replaced, if any
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: LeaseLostError | None = None
        self._released = False

    @property
    def info(self) -> LeaseInfo:
        return self._info

    @classmethod
    def acquire(cls, model_dir: str, *, ttl_s: float = DEFAULT_TTL_S, take_over_dead: bool = True,
                warn: Callable[[str], None] | None = None) -> Lease:
        """Takes the lease of `model_dir`, or raises `LeaseHeldError` naming the holder.

        A dead holder (its process gone on this host, or its renewals stopped more than its ttl ago)
        is taken over when `take_over_dead`, with one line passed to `warn` (default: stderr).
        """
        if ttl_s <= 0:
            raise errors.ConfigValueError(f"The lease ttl must be positive, not {ttl_s}")
        warn = warn or _print_warning
        store = store_for(model_dir)
        with storage_errors(model_dir):
            store.prepare()
            run_id = uuid.uuid4().hex
            lock = store.hold_lock(run_id)
            try:
                return cls._acquire(store, model_dir, run_id, lock, ttl_s, take_over_dead, warn)
            except BaseException:
                store.drop_lock(lock)
                raise

    @classmethod
    def _acquire(cls, store, model_dir, run_id, lock, ttl_s, take_over_dead, warn) -> Lease:
        for _ in range(_ATTEMPTS):
            now = time.time()
            info = LeaseInfo(host=socket.gethostname(), pid=os.getpid(), started=now, renewed=now, run_id=run_id,
                             path=store.path, ttl_s=ttl_s, pid_start=(proc_stat(os.getpid()) or (None, None))[1])
            token = store.create(info)
            if token is not None:
                return cls(store, info, lock, None)
            current = store.read()
            if current is None:
                continue  # released meanwhile: try to create it again
            held, held_token = current
            state, why = _judge(held)
            if state == "dead" and take_over_dead:
                token = store.replace(held, held_token, info)
                if token is not None:
                    store.cleanup(held)
                    warn(f"took over the lease of {model_dir} from a dead run ({held.describe()}): {why}")
                    return cls(store, info, lock, held)
                continue  # another run changed it first: look again
            if state == "dead":
                raise LeaseHeldError(f"{model_dir} holds the lease of a dead run ({held.describe()}: {why}); "
                                     f"`t5x-lite checkpoint unlock {model_dir}` removes it")
            raise LeaseHeldError(
                f"{model_dir} is in use by another run ({held.describe()}; {why}). Two trainers writing one "
                f"model directory destroy each other's checkpoints: wait for it or use another model directory; "
                f"if that run is dead, `t5x-lite checkpoint unlock {model_dir} --force` removes its lease")
        raise LeaseHeldError(f"The lease of {model_dir} changed hands {_ATTEMPTS} times while this run tried to "
                             "take it: other runs are starting there; try again")

    def _lost(self, current: LeaseInfo | None) -> LeaseLostError:
        if current is None:
            what = "was removed (by `t5x-lite checkpoint unlock --force`?)"
        else:
            what = (f"now belongs to another run ({current.describe()}): it was removed (`t5x-lite checkpoint "
                    "unlock --force`) or expired unrenewed, and that run took the directory over")
        return LeaseLostError(f"This run's lease of {self._store.path} {what}. Stop this run: two writers destroy "
                              "each other's checkpoints")

    def renew(self) -> None:
        """Rewrites `renewed`; raises `LeaseLostError` if the lease is gone or holds another run's id."""
        with self._mutex, storage_errors(self._store.path):
            for _ in range(3):
                current = self._store.read()
                if current is None or current[0].run_id != self._info.run_id:
                    raise self._lost(None if current is None else current[0])
                new = dataclasses.replace(self._info, renewed=time.time())
                token = self._store.replace(current[0], current[1], new)
                if token is not None:
                    self._info = new
                    return
            raise storage.StorageError(f"Cannot renew the lease {self._store.path}: it kept changing")

    def start_renewing(self, every_s: float | None = None) -> None:
        """Renews in a daemon thread every `every_s` (default ttl/3); `check()` reports a lost lease."""
        if self._thread is not None or self._released:
            return
        every = self._info.ttl_s / 3 if every_s is None else every_s

        def renew_until_stopped():
            last_ok = time.monotonic()
            while not self._stop.wait(every):
                try:
                    self.renew()
                    last_ok = time.monotonic()
                except LeaseLostError as e:
                    self._failure = e
                    return
                except Exception as e:  # storage trouble: retry; past the ttl another run may take over
                    if time.monotonic() - last_ok > self._info.ttl_s:
                        self._failure = LeaseLostError(
                            f"Could not renew the lease {self._store.path} for {self._info.ttl_s:.0f} s ({e}); "
                            "another run may have taken the directory over. Stop this run")
                        return

        self._thread = threading.Thread(target=renew_until_stopped, name="t5x-lite-lease", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raises `LeaseLostError` if the background renewal found the lease lost."""
        if self._failure is not None:
            raise self._failure

    def release(self) -> None:
        """Removes the lease if it still names this run; stops the renewals. Idempotent."""
        if self._released:
            return
        self._released = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._mutex, storage_errors(self._store.path):
            try:
                current = self._store.read()
                if current is not None and current[0].run_id == self._info.run_id:
                    self._store.remove(current[0], current[1])
            finally:
                self._store.drop_lock(self._lock)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.release()
        except Exception as e:
            if exc_type is None:
                raise
            _print_warning(f"could not release the lease {self._store.path}: {e}")


def unlock(model_dir: str, *, force: bool = False) -> LeaseInfo | None:
    """Removes the lease of `model_dir` and returns it (None if there was none); a live holder (or one
    whose state cannot be told) is refused with `LeaseHeldError` unless `force`."""
    return _unlock(model_dir, force)[0]


def _unlock(model_dir: str, force: bool) -> tuple[LeaseInfo | None, str]:
    """`unlock`, and the line that says what it did."""
    store = store_for(model_dir)
    with storage_errors(model_dir):
        try:
            current = store.read()
        except CorruptLeaseError:
            if not force:
                raise
            store.remove(None, "")
            return None, f"removed the unreadable lease file {store.path}"
        if current is None:
            return None, f"{model_dir} has no lease: nothing removed"
        info, token = current
        state, why = _judge(info)
        if state != "dead" and not force:
            raise LeaseHeldError(
                f"{model_dir} is held by a {'live' if state == 'live' else 'possibly live'} run ({info.describe()}; "
                f"{why}); stop it first, or add --force if you are sure it is not writing")
        if not store.remove(info, token):
            raise LeaseHeldError(f"The lease of {model_dir} changed while it was being removed; run the command again")
        store.cleanup(info)
        return info, f"removed the lease of {model_dir}: {info.describe()}"


def unlock_main(argv: Sequence[str]) -> int:
    """`t5x-lite checkpoint unlock MODEL_DIR [--force]` (argv: what follows `unlock`); 0, or 2 on refusal."""
    parser = argparse.ArgumentParser(
        prog="t5x-lite checkpoint unlock",
        description="Removes MODEL_DIR/lease.json, the lease of the run that writes MODEL_DIR, when that run is dead.")
    parser.add_argument("model_dir", help="a model directory (local, gs:// or s3://)")
    parser.add_argument("--force", action="store_true",
                        help="remove the lease even if its holder looks alive (only if you know it is not writing)")
    args = parser.parse_args(list(argv))
    with errors.reported():
        print(_unlock(args.model_dir, args.force)[1])
    return 0
