"""One writer per model directory: the lease, with real processes (local), moto's S3 server (s3://)
and a GCS emulator (gs://)."""

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid

import pytest

from t5x_lite import storage
from t5x_lite.checkpoints import lease
from t5x_lite.checkpoints.lease_store import GcsStore, LocalStore, S3Store
from tests.conftest import S3_BUCKET
from tests.gcs_emulator import BUCKET as GCS_BUCKET

HOST = socket.gethostname()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A contender: says "ready", waits for "go", tries to take the lease, says "won <pid>" or "held <message>"
# (after any "warn <line>"), then holds it until its stdin says so or closes.
CONTENDER = r"""
import sys
from t5x_lite.checkpoints import lease
print("ready", flush=True)
sys.stdin.readline()
try:
    held = lease.Lease.acquire(sys.argv[1], warn=lambda m: print("warn " + m, flush=True))
except lease.LeaseHeldError as e:
    print("held " + str(e), flush=True)
else:
    print(f"won {held.info.pid}", flush=True)
    sys.stdin.readline()
    held.release()
"""


def _start(model_dir, count):
    procs = [subprocess.Popen([sys.executable, "-c", CONTENDER, str(model_dir)], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE) for _ in range(count)]
    for proc in procs:
        assert proc.stdout.readline() == "ready\n"
    for proc in procs:  # as close together as two writes can be
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return procs


def _outcome(proc):
    """(warnings, 'won' | 'held', rest of the line)."""
    warnings = []
    while True:
        line = proc.stdout.readline().rstrip("\n")
        kind, _, rest = line.partition(" ")
        if kind == "warn":
            warnings.append(rest)
        else:
            assert kind in ("won", "held"), line
            return warnings, kind, rest


def _finish(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.stdin.close()
        assert proc.wait(timeout=30) == 0


def _write_lease(model_dir, *, host=HOST, pid=4242, renewed_ago=0.0, ttl_s=120.0, pid_start=None):
    now = time.time()
    info = lease.LeaseInfo(host=host, pid=pid, started=now - renewed_ago - 60, renewed=now - renewed_ago,
                           run_id=uuid.uuid4().hex, path=os.path.join(model_dir, lease.LEASE_FILE), ttl_s=ttl_s,
                           pid_start=pid_start)
    os.makedirs(model_dir, exist_ok=True)
    with open(info.path, "w") as f:
        f.write(info.to_json())
    return info


def _dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_two_processes_exactly_one_wins(tmp_path):
    model_dir = tmp_path / "run"
    procs = _start(model_dir, 2)
    try:
        outcomes = [_outcome(proc) for proc in procs]
        assert sorted(kind for _, kind, _ in outcomes) == ["held", "won"]
        assert all(not warnings for warnings, _, _ in outcomes)
        winner = next(rest for _, kind, rest in outcomes if kind == "won")
        message = next(rest for _, kind, rest in outcomes if kind == "held")
        assert f"pid {winner} on host {HOST}" in message and "is in use by another run" in message
        assert f"`t5x-lite checkpoint unlock {model_dir} --force`" in message
        info = lease.read_lease(str(model_dir))
        assert info.pid == int(winner) and lease.holder_state(info) == "live"
        assert os.path.exists(model_dir / f"lease.{info.run_id}.lock")  # its flock, held for its life
    finally:
        _finish(procs)
    assert lease.read_lease(str(model_dir)) is None  # released on the way out
    assert sorted(os.listdir(model_dir)) == []


def test_a_killed_holder_is_dead_and_taken_over_by_exactly_one(tmp_path):
    model_dir = tmp_path / "run"
    [holder] = _start(model_dir, 1)
    assert _outcome(holder)[1] == "won"
    holder.kill()  # SIGKILL: no chance to release
    holder.wait()
    dead = lease.read_lease(str(model_dir))
    assert dead.pid == holder.pid and lease.holder_state(dead) == "dead"

    procs = _start(model_dir, 2)
    try:
        outcomes = [_outcome(proc) for proc in procs]
        assert sorted(kind for _, kind, _ in outcomes) == ["held", "won"]
        [(warnings, _, winner)] = [o for o in outcomes if o[1] == "won"]
        [warning] = warnings
        assert warning.startswith(f"took over the lease of {model_dir} from a dead run "
                                  f"(pid {holder.pid} on host {HOST}")
        assert warning.endswith("its process is gone")
        [(_, _, message)] = [o for o in outcomes if o[1] == "held"]
        assert f"pid {winner} on host {HOST}" in message
        assert not os.path.exists(model_dir / f"lease.{dead.run_id}.lock")  # the dead run's lock cleaned up
    finally:
        _finish(procs)


def test_a_probe_of_a_lock_is_not_mistaken_for_its_holder(tmp_path):
    """Two runs judging one dead lease probe its lock at once: a probe in progress (a shared lock
    here) must not read as the holder, while the holder's exclusive lock does."""
    import fcntl

    from t5x_lite.checkpoints.lease_store import flock_held

    path = str(tmp_path / "lease.x.lock")
    open(path, "w").close()
    assert flock_held(path) is False
    other = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)  # another run's probe, in progress
        assert flock_held(path) is False
        fcntl.flock(other, fcntl.LOCK_UN)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the holder
        assert flock_held(path) is True
    finally:
        os.close(other)


def test_an_expired_lease_of_another_host_is_taken_over(tmp_path):
    model_dir = str(tmp_path / "run")
    old = _write_lease(model_dir, host="other-host", renewed_ago=500, ttl_s=120)
    assert lease.holder_state(old) == "dead" and lease.holder_state(old, ttl_s=600) == "live"
    warnings = []
    with lease.Lease.acquire(model_dir, warn=warnings.append) as held:
        assert held.taken_over == old and lease.read_lease(model_dir).run_id == held.info.run_id
    [warning] = warnings
    assert "from a dead run (pid 4242 on host other-host" in warning
    assert "its renewals stopped 500 s ago, more than its ttl of 120 s" in warning
    assert lease.read_lease(model_dir) is None


def test_a_live_lease_of_another_host_is_refused(tmp_path):
    model_dir = str(tmp_path / "run")
    live = _write_lease(model_dir, host="other-host", renewed_ago=5)
    with pytest.raises(lease.LeaseHeldError, match=r"pid 4242 on host other-host, started .* UTC, renewed 5 s ago"):
        lease.Lease.acquire(model_dir)
    with pytest.raises(lease.LeaseHeldError, match="add --force if you are sure"):
        lease.unlock(model_dir)
    assert lease.read_lease(model_dir) == live  # untouched
    assert lease.unlock(model_dir, force=True) == live and lease.read_lease(model_dir) is None
    assert lease.unlock(model_dir) is None


def test_take_over_dead_false_and_pid_signals(tmp_path):
    model_dir = str(tmp_path / "run")
    dead = _write_lease(model_dir, pid=_dead_pid())
    with pytest.raises(lease.LeaseHeldError, match=r"holds the lease of a dead run .*its process is gone.*"
                                                   r"`t5x-lite checkpoint unlock .*` removes it"):
        lease.Lease.acquire(model_dir, take_over_dead=False)
    # A running pid with another start time is a reused pid: its run is dead.
    reused = _write_lease(model_dir, pid=os.getpid(), pid_start=1)
    assert lease.holder_state(reused) == "dead"
    # A gone process whose lock someone still holds (a child it forked?): unknown, never taken over.
    lock = LocalStore(model_dir).hold_lock(dead.run_id)
    try:
        with open(dead.path, "w") as f:
            f.write(dead.to_json())
        assert lease.holder_state(dead) == "unknown"
        with pytest.raises(lease.LeaseHeldError, match="its process is gone but its lock .* is still held"):
            lease.Lease.acquire(model_dir)
    finally:
        LocalStore(model_dir).drop_lock(lock)
    assert lease.holder_state(dead) == "dead"


def test_renew_after_a_forced_unlock_and_take_over_raises_lease_lost(tmp_path):
    model_dir = str(tmp_path / "run")
    first = lease.Lease.acquire(model_dir)
    first.renew()
    assert lease.read_lease(model_dir).renewed == first.info.renewed >= first.info.started
    with pytest.raises(lease.LeaseHeldError, match=r"held by a live run \(pid .*its process is running"):
        lease.unlock(model_dir)  # this process holds it: live
    first.start_renewing(every_s=0.05)
    assert lease.unlock(model_dir, force=True).run_id == first.info.run_id
    second = lease.Lease.acquire(model_dir)  # no lease: a fresh one, no warning
    assert second.taken_over is None
    with pytest.raises(lease.LeaseLostError, match=r"now belongs to another run \(pid \d+ on host"):
        first.renew()
    deadline = time.monotonic() + 10
    while first._failure is None and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(lease.LeaseLostError, match="Stop this run"):
        first.check()
    first.release()  # never removes another run's lease
    first.release()
    assert lease.read_lease(model_dir).run_id == second.info.run_id
    second.release()
    assert lease.read_lease(model_dir) is None
    second.release()  # idempotent


def test_a_removed_lease_is_lost_too(tmp_path):
    model_dir = str(tmp_path / "run")
    with lease.Lease.acquire(model_dir) as held:
        lease.unlock(model_dir, force=True)
        with pytest.raises(lease.LeaseLostError, match="was removed"):
            held.renew()


def test_a_stale_takeover_mutex_is_broken(tmp_path):
    model_dir = str(tmp_path / "run")
    _write_lease(model_dir, pid=_dead_pid())
    with open(os.path.join(model_dir, "lease.json.takeover"), "w") as f:
        json.dump({"host": HOST, "pid": _dead_pid(), "pid_start": None, "created": time.time(), "token": "x"}, f)
    warnings = []
    with lease.Lease.acquire(model_dir, warn=warnings.append):
        assert len(warnings) == 1
    assert os.listdir(model_dir) == []


def test_unlock_main_exit_codes_and_output(tmp_path, capsys):
    model_dir = str(tmp_path / "run")
    assert lease.unlock_main([model_dir]) == 0
    assert capsys.readouterr().out == f"{model_dir} has no lease: nothing removed\n"

    _write_lease(model_dir, host="other-host", renewed_ago=1)
    with pytest.raises(SystemExit) as exit_info:
        lease.unlock_main([model_dir])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"error: {model_dir} is held by a live run (pid 4242")

    assert lease.unlock_main([model_dir, "--force"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(f"removed the lease of {model_dir}: pid 4242 on host other-host")

    with open(os.path.join(model_dir, lease.LEASE_FILE), "w") as f:
        f.write("not json")
    os.utime(os.path.join(model_dir, lease.LEASE_FILE), (time.time() - 60,) * 2)  # not one being written
    with pytest.raises(SystemExit):
        lease.unlock_main([model_dir])
    assert "is not a lease file" in capsys.readouterr().err
    assert lease.unlock_main([model_dir, "--force"]) == 0 and lease.read_lease(model_dir) is None
    assert capsys.readouterr().out == f"removed the unreadable lease file {model_dir}/lease.json\n"


def test_storage_errors_are_one_line(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(storage.StorageError, match="Cannot use the lease of"):
        lease.Lease.acquire(str(blocked / "run"))


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_conditional_create_renew_take_over_and_release(scheme, request):
    """s3: If-None-Match / If-Match on the ETag (moto); gs: ifGenerationMatch (the GCS emulator)."""
    request.getfixturevalue("s3_server" if scheme == "s3" else "gcs_server")
    model_dir = f"{scheme}://{S3_BUCKET if scheme == 's3' else GCS_BUCKET}/lease-run"
    first = lease.Lease.acquire(model_dir)
    with pytest.raises(lease.LeaseHeldError, match=rf"pid {os.getpid()} on host {HOST}.*expires unless renewed"):
        lease.Lease.acquire(model_dir)
    assert lease.read_lease(model_dir).run_id == first.info.run_id  # the second create was refused

    store = (S3Store if scheme == "s3" else GcsStore)(model_dir)
    _, etag = store.read()
    first.renew()
    _, renewed_etag = store.read()
    assert renewed_etag != etag
    stale = dataclasses.replace(first.info, run_id=uuid.uuid4().hex)
    assert store.replace(first.info, etag, stale) is None  # an old ETag / generation
    if scheme == "s3":  # fake-gcs-server does not check a delete's ifGenerationMatch (GCS does)
        assert not store.remove(first.info, etag)
    first.release()
    assert lease.read_lease(model_dir) is None

    # An expired lease (another host stopped renewing 10 min ago) is taken over; its old holder has lost it.
    now = time.time()
    expired = lease.LeaseInfo("other-host", 7, now - 900, now - 600, uuid.uuid4().hex, store.path)
    assert store.create(expired) is not None
    warnings = []
    taker = lease.Lease.acquire(model_dir, warn=warnings.append)
    assert taker.taken_over == expired and re.search(r"its renewals stopped 60\d s ago", warnings[0])
    assert lease.unlock(model_dir, force=True).run_id == taker.info.run_id
    assert store.create(expired) is not None
    with pytest.raises(lease.LeaseLostError, match="other-host"):
        taker.renew()
    taker.release()
    assert lease.read_lease(model_dir) == expired
    assert lease.unlock(model_dir).run_id == expired.run_id and lease.read_lease(model_dir) is None


def test_s3_missing_bucket_is_a_storage_error(s3_server):
    with pytest.raises(storage.StorageError, match="bucket s3://no-such-bucket-lease does not exist"):
        lease.Lease.acquire("s3://no-such-bucket-lease/run")


def test_gcs_racing_processes_exactly_one_wins(gcs_server):
    model_dir = f"gs://{GCS_BUCKET}/lease-race"
    procs = _start(model_dir, 4)
    outcomes = [_outcome(proc) for proc in procs]
    winners = [rest for _, kind, rest in outcomes if kind == "won"]
    assert len(winners) == 1, outcomes
    assert all("is in use by another run (pid" in rest for _, kind, rest in outcomes if kind == "held"), outcomes
    assert lease.read_lease(model_dir).pid == int(winners[0])
    _finish(procs)
    assert lease.read_lease(model_dir) is None


def test_gcs_missing_bucket_is_a_storage_error(gcs_server):
    with pytest.raises(storage.StorageError, match=f"bucket gs://{GCS_BUCKET}-missing does not exist"):
        lease.Lease.acquire(f"gs://{GCS_BUCKET}-missing/run")
