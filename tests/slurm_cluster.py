"""A real single-node SLURM cluster that a test starts and stops, for testing the SLURM launcher.

`LocalSlurmCluster(root)` runs munged, slurmctld and slurmd (Debian's slurm-wlm and munge) as
subprocesses of the test with a generated slurm.conf under `root` on free ports, so it touches
neither a system cluster nor another test's, and `stop()` leaves no process behind:

    with LocalSlurmCluster(tmp_path / "slurm") as cluster:
        job = cluster.submit(script, "--ntasks=2")
        assert cluster.wait(job, timeout=60).state == "COMPLETED"

It needs root (slurmd launches jobs; munged runs as the munge user): `unavailable_reason()`
says why it cannot start here. munged's files live in a short-lived folder under /tmp rather than
under `root`: munged requires every folder above its socket to be executable by all (pytest's
/tmp/pytest-of-root is 0700), and a UNIX socket path must fit in 108 bytes.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PROGRAMS = ("slurmctld", "slurmd", "sbatch", "munged", "mungekey")
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE"}
INSTALL = "apt-get install -y --no-install-recommends slurm-wlm munge"


def _which(name: str) -> str | None:
    """The program's path; the daemons live in /usr/sbin, which a non-login PATH may lack."""
    return shutil.which(name, path=os.environ.get("PATH", os.defpath) + ":/usr/sbin:/sbin")


def unavailable_reason() -> str | None:
    """Why a local cluster cannot start on this machine; None when it can."""
    if os.geteuid() != 0:
        return "a local SLURM cluster needs root (slurmd launches jobs, munged runs as munge)"
    missing = [name for name in PROGRAMS if _which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed: {INSTALL}"
    return None


@dataclasses.dataclass(frozen=True)
class JobResult:
    state: str  # COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    exit_code: int  # the batch script's exit status: `a` of ExitCode=a:b
    signal: int  # the signal that ended it: `b` of ExitCode=a:b


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"--- {path}: missing"
    return f"--- {path} (last {len(text)} lines)\n" + "\n".join(text)


class LocalSlurmCluster:
    """munged + slurmctld + slurmd for one node `localhost` with `cpus` CPUs and partition `debug`."""

    def __init__(self, root: Path, cpus: int = 2):
        self.root = Path(root).resolve()
        self.cpus = cpus
        self.conf = self.root / "slurm.conf"
        self.munge_dir: Path | None = None
        self._procs: dict[str, subprocess.Popen] = {}

    @property
    def env(self) -> dict[str, str]:
        """What a client command (sbatch, srun, squeue, ...) needs to talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Runs a SLURM client command against this cluster, its output captured as text."""
        return subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=timeout)

    def submit(self, script: Path, *sbatch_args: str) -> int:
        """`sbatch --parsable ARGS SCRIPT`; the job id."""
        proc = self.run("sbatch", "--parsable", *sbatch_args, str(script))
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed ({proc.returncode}): {proc.stderr.strip()}")
        return int(proc.stdout.strip().split(";")[0])

    def job_fields(self, job_id: int) -> dict[str, str]:
        """`scontrol show job -o ID` as a dict (JobState, ExitCode, StdOut, ...)."""
        proc = self.run("scontrol", "show", "job", "-o", str(job_id))
        if proc.returncode != 0:
            raise RuntimeError(f"scontrol show job {job_id} failed: {proc.stderr.strip()}")
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))

    def wait(self, job_id: int, timeout: float) -> JobResult:
        """Polls until the job has finished; on timeout cancels it and raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job_fields(job_id)
            if fields.get("JobState") in FINISHED:
                code, _, sig = fields.get("ExitCode", "0:0").partition(":")
                return JobResult(fields["JobState"], int(code), int(sig or 0))
            if time.monotonic() > deadline:
                self.run("scancel", str(job_id))
                raise TimeoutError(f"job {job_id} still {fields.get('JobState')} after {timeout}s")
            time.sleep(0.2)

    # -- start / stop ---------------------------------------------------------------------------

    def __enter__(self) -> LocalSlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 60) -> None:
        """Starts munged, slurmctld and slurmd; returns once the node is idle (stops all on error)."""
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        try:
            self._start_munged()
            self._write_conf()
            for name in ("slurmctld", "slurmd"):
                (self.root / name).mkdir(parents=True, exist_ok=True)
            self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
            self._spawn("slurmd", ["slurmd", "-D", "-N", "localhost", "-f", str(self.conf)])
            self._wait_until(lambda: self.run("sinfo", "-h", "-n", "localhost", "-o", "%T",
                                              timeout=10).stdout.strip() == "idle",
                             timeout, "node localhost to be idle")
        except BaseException:
            self.stop()
            raise

    def _start_munged(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        munge = self.munge_dir = Path(tempfile.mkdtemp(prefix="munge-", dir="/tmp"))
        subprocess.run([_which("mungekey"), "-c", "-k", str(munge / "munge.key")], check=True,
                       capture_output=True)
        os.chmod(munge, 0o755)  # munged: its socket's folders executable by all, none writable by all
        for path in (munge, munge / "munge.key"):
            shutil.chown(path, "munge", "munge")
        os.chmod(munge / "munge.key", 0o600)
        # -F: in the foreground munged logs to stderr, i.e. root/munged.out (--log-file is unused)
        self._spawn("munged", ["munged", "-F", f"--socket={munge / 'munge.socket'}",
                               f"--key-file={munge / 'munge.key'}", f"--pid-file={munge / 'munged.pid'}",
                               f"--seed-file={munge / 'munged.seed'}"],
                    user="munge", group="munge", extra_groups=[])
        self._wait_until(lambda: (munge / "munge.socket").exists(), 10, "munged's socket")

    def _write_conf(self) -> None:
        ctld_port, slurmd_port = _free_port(), _free_port()
        while slurmd_port == ctld_port:
            slurmd_port = _free_port()
        r = self.root
        self.conf.write_text(f"""\
# Generated by tests/slurm_cluster.py: a single-node test cluster.
ClusterName=t5xlite
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_dir / 'munge.socket'}
CredType=cred/munge
StateSaveLocation={r / 'slurmctld'}
SlurmdSpoolDir={r / 'slurmd'}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'slurmd.pid'}
SlurmctldLogFile={r / 'slurmctld.log'}
SlurmdLogFile={r / 'slurmd.log'}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
KillWait=2
InactiveLimit=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
""")

    def _spawn(self, name: str, cmd: list[str], **kwargs) -> None:
        with open(self.root / f"{name}.out", "ab") as out:
            self._procs[name] = subprocess.Popen([_which(cmd[0]), *cmd[1:]], stdin=subprocess.DEVNULL,
                                                 stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                                 **kwargs)

    def _wait_until(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [f"{name} exited with {p.returncode}" for name, p in self._procs.items()
                    if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = ", ".join(dead) if dead else f"not ready after {timeout}s"
                raise RuntimeError(f"SLURM test cluster: waiting for {what}: {why}\n{self._log_tails()}")
            time.sleep(0.2)

    def _log_tails(self) -> str:
        logs = [self.root / f"{name}{ext}" for name in ("slurmctld", "slurmd", "munged")
                for ext in (".log", ".out")]
        return "\n".join(_tail(p) for p in logs if p.exists())

    def stop(self) -> None:
        """Cancels the jobs, stops the daemons and kills whatever of this cluster is left."""
        if self._procs.get("slurmctld") and self._procs["slurmctld"].poll() is None:
            try:
                jobs = self.run("squeue", "-h", "-o", "%A", timeout=10).stdout.split()
                if jobs:
                    self.run("scancel", *jobs, timeout=10)
                    deadline = time.monotonic() + 15  # KillWait=2: tasks get SIGKILL after 2s
                    while time.monotonic() < deadline and self.run(
                            "squeue", "-h", "-o", "%A", timeout=10).stdout.strip():
                        time.sleep(0.2)
            except (subprocess.SubprocessError, OSError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self._procs.pop(name, None)
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._kill_leftovers()
        if self.munge_dir is not None:
            shutil.rmtree(self.munge_dir, ignore_errors=True)
            self.munge_dir = None

    def _kill_leftovers(self) -> None:
        """SIGKILLs slurmstepd and job processes that outlived slurmd: all carry our SLURM_CONF."""
        marker = f"SLURM_CONF={self.conf}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:  # gone meanwhile
                continue
