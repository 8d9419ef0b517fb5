"""Multi-process runs: join this process to the others of the run before any device is used.

One JAX process runs per host (or per GPU); together they see every device of the run and
execute the same jitted steps on global arrays. Which processes form a run comes from, in order:

  1. explicit flags: --coordinator_address=HOST:PORT --num_processes=N --process_id=I;
  2. a SLURM job step of several tasks (`srun`), read from SLURM's environment;
  3. a Cloud TPU VM (JAX reads the slice's workers from the TPU metadata);
  4. otherwise a single process, and nothing is initialised.

`--distributed=off` skips 2 and 3. On CPU the processes exchange data through gloo, so a
multi-process run on one machine is a real distributed run.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import re
import socket
import sys
import threading
import time
from typing import Mapping, Sequence

from t5x_lite.errors import UserError


class DistributedConfigError(UserError, ValueError):
    """The flags or environment describing the processes of a run cannot work."""


class CoordinatorUnreachableError(UserError, ConnectionError):
    """Process 0 (the coordinator) did not answer within the timeout."""


FLAGS = ("coordinator_address", "num_processes", "process_id", "distributed", "distributed_timeout")
FLAGS_HELP = """multi-process flags (see docs/launch.md):
  --coordinator_address=HOST:PORT  process 0's address; with --num_processes and --process_id
  --num_processes=N                how many processes the run has
  --process_id=I                   this process's index, 0 <= I < N
  --distributed=auto|off           auto (default): join SLURM job steps and Cloud TPU slices
  --distributed_timeout=SECONDS    how long to wait for the other processes (default 300)"""

# Ports JAX's own SLURM detection draws from: the top 4096 ports, one per job id.
_SLURM_PORT_BASE = 65535 - 2**12 + 1
_GOOGLE_PCI_VENDOR = "0x1ae0"


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """How this process joins the run: who coordinates, how many processes, which one this is.

    `num_processes` and `process_id` are None on a Cloud TPU slice, where JAX reads them from
    the TPU metadata. `local_device_ids` (GPU indices this process drives) is None for all.
    """

    source: str  # "flags", "slurm" or "cloud-tpu"
    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None
    local_device_ids: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class DistributedFlags:
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    mode: str = "auto"
    timeout_seconds: int = 300


def parse_flags(args: Sequence[str]) -> tuple[DistributedFlags, list[str]]:
    """Takes the multi-process flags out of `args`; returns them and the other arguments."""
    values: dict[str, str] = {}
    rest = []
    for arg in args:
        name, _, value = arg.removeprefix("--").partition("=")
        if arg.startswith("--") and name in FLAGS:
            if not value:
                raise DistributedConfigError(f"--{name} needs a value: --{name}=VALUE.")
            values[name] = value
        else:
            rest.append(arg)

    def integer(name: str) -> int | None:
        if name not in values:
            return None
        try:
            return int(values[name])
        except ValueError:
            raise DistributedConfigError(f"--{name}={values[name]!r} is not an integer.") from None

    mode = values.get("distributed", "auto")
    if mode not in ("auto", "off"):
        raise DistributedConfigError(f"--distributed={mode!r}: use auto or off.")
    timeout = integer("distributed_timeout")
    if timeout is not None and timeout <= 0:
        raise DistributedConfigError(f"--distributed_timeout={timeout} must be a positive number of seconds.")
    flags = DistributedFlags(coordinator_address=values.get("coordinator_address"),
                             num_processes=integer("num_processes"), process_id=integer("process_id"),
                             mode=mode, timeout_seconds=timeout or 300)
    return flags, rest


def plan(flags: DistributedFlags, environ: Mapping[str, str] = os.environ) -> ProcessGroup | None:
    """The process group this process should join (None: run as a single process).

    Pure: reads only `flags` and `environ` (and, for Cloud TPU, whether TPU chips are present).
    """
    explicit = (flags.coordinator_address, flags.num_processes, flags.process_id)
    if any(v is not None for v in explicit):
        return _from_flags(flags)
    if flags.mode == "off":
        return None
    slurm = slurm_group(environ)
    if slurm is not None:
        return slurm
    if on_cloud_tpu_vm():
        return ProcessGroup(source="cloud-tpu", coordinator_address=None, num_processes=None, process_id=None)
    return None


def _from_flags(flags: DistributedFlags) -> ProcessGroup:
    missing = [f"--{n}" for n, v in (("coordinator_address", flags.coordinator_address),
                                      ("num_processes", flags.num_processes),
                                      ("process_id", flags.process_id)) if v is None]
    if missing:
        raise DistributedConfigError(
            f"Multi-process flags need all three of --coordinator_address, --num_processes and --process_id; "
            f"missing {', '.join(missing)}.")
    check_address(flags.coordinator_address, name="--coordinator_address")
    check_process_id(flags.process_id, flags.num_processes)
    return ProcessGroup(source="flags", coordinator_address=flags.coordinator_address,
                        num_processes=flags.num_processes, process_id=flags.process_id)


def check_address(address: str, *, name: str) -> tuple[str, int]:
    """(host, port) of 'HOST:PORT'; a DistributedConfigError naming `name` otherwise."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DistributedConfigError(f"{name}={address!r}: expected HOST:PORT, e.g. 10.0.0.1:12345.")
    return host.strip("[]"), int(port)


def check_process_id(process_id: int, num_processes: int) -> None:
    if num_processes < 1:
        raise DistributedConfigError(f"--num_processes={num_processes}: a run has at least one process.")
    if not 0 <= process_id < num_processes:
        raise DistributedConfigError(
            f"--process_id={process_id} is out of range for --num_processes={num_processes}: "
            f"use 0 to {num_processes - 1}, a different one in each process (0 is the coordinator).")


# -- SLURM ---------------------------------------------------------------------------------------

def slurm_group(environ: Mapping[str, str]) -> ProcessGroup | None:
    """The group of an `srun` job step with several tasks; None outside one.

    A batch script itself (outside srun) is one process even when the job has several tasks,
    so only a step's own variables count (SLURM_STEP_NUM_TASKS, set by srun).
    """
    tasks = environ.get("SLURM_STEP_NUM_TASKS")
    if not tasks or "SLURM_PROCID" not in environ:
        return None
    num_processes, process_id = _slurm_int(environ, "SLURM_STEP_NUM_TASKS"), _slurm_int(environ, "SLURM_PROCID")
    if num_processes < 2:
        return None
    check_process_id(process_id, num_processes)
    host = first_slurm_host(environ["SLURM_STEP_NODELIST"])
    port = environ.get("JAX_COORDINATOR_PORT") or str(_slurm_int(environ, "SLURM_JOB_ID") % 2**12 + _SLURM_PORT_BASE)
    return ProcessGroup(source="slurm", coordinator_address=f"{host}:{port}", num_processes=num_processes,
                        process_id=process_id, local_device_ids=_slurm_local_devices(environ))


def _slurm_int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        raise DistributedConfigError(f"{name}={environ.get(name)!r} is not a number; this is not a usable SLURM "
                                     "job step (run with --distributed=off to run alone).") from None


def first_slurm_host(node_list: str) -> str:
    """The first host of a SLURM node list: 'gpu[003-006,9],cpu1' -> 'gpu003'."""
    match = re.match(r"([^,\[]+)(?:\[([^\],\-]+))?", node_list.strip())
    if not match:
        raise DistributedConfigError(f"Cannot read the SLURM node list {node_list!r}.")
    return match.group(1) + (match.group(2) or "")


def tasks_on_node(tasks_per_node: str, node_index: int) -> int:
    """The tasks SLURM runs on node `node_index`, from e.g. SLURM_STEP_TASKS_PER_NODE='4(x2),2'."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise DistributedConfigError(f"Cannot read SLURM's tasks per node {tasks_per_node!r}.")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if not 0 <= node_index < len(counts):
        raise DistributedConfigError(f"SLURM_NODEID={node_index} is not a node of SLURM's tasks per node "
                                     f"{tasks_per_node!r}.")
    return counts[node_index]


def _slurm_local_devices(environ: Mapping[str, str]) -> tuple[int, ...] | None:
    """With one task per GPU, each task drives the GPU of its local rank; with one task per
    node (or GPUs already bound by SLURM), every visible GPU."""
    visible = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE")
    if len(visible) == 1 or not per_node:
        return None
    if tasks_on_node(per_node, _slurm_int({"SLURM_NODEID": "0", **environ}, "SLURM_NODEID")) < 2:
        return None
    return (_slurm_int(environ, "SLURM_LOCALID"),)


# -- Cloud TPU -----------------------------------------------------------------------------------

def on_cloud_tpu_vm() -> bool:
    """A TPU VM: Google TPU chips on the PCI bus and the TPU runtime (libtpu) installed."""
    vendors = glob.glob("/sys/bus/pci/devices/*/vendor")
    has_chips = any(_read(path) == _GOOGLE_PCI_VENDOR for path in vendors)
    return has_chips and importlib.util.find_spec("libtpu") is not None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


# -- joining -------------------------------------------------------------------------------------

def wait_for_coordinator(address: str, *, timeout_seconds: float, poll_seconds: float = 0.5) -> None:
    """Returns once `address` accepts a TCP connection; CoordinatorUnreachableError after the timeout.

    JAX aborts the whole process when the coordinator cannot be reached; probing first turns
    that into an error that says what to check.
    """
    host, port = check_address(address, name="the coordinator address")
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(poll_seconds * 4, 5)):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise CoordinatorUnreachableError(
                    f"The coordinator {address} did not answer within {timeout_seconds:g} s ({e}). Check that "
                    "process 0 of the run started and is listening there (same --coordinator_address in every "
                    "process; the host name resolves and the port is open between the hosts), or raise "
                    "--distributed_timeout.") from None
            time.sleep(poll_seconds)


def initialize(group: ProcessGroup, *, timeout_seconds: int = 300) -> None:
    """Joins `group` (jax.distributed.initialize); call before anything touches a device."""
    import jax  # jax loads in seconds: imported where first needed, so commands that need no device start fast

    # Only the CPU backend reads this: CPU processes exchange arrays through gloo.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if group.process_id not in (None, 0):
        wait_for_coordinator(group.coordinator_address, timeout_seconds=timeout_seconds)
    # JAX aborts the process (no Python exception) when the others never join: say why first.
    watchdog = threading.Timer(max(timeout_seconds - 1, 1), _explain_join_timeout, args=(group, timeout_seconds))
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(
            coordinator_address=group.coordinator_address, num_processes=group.num_processes,
            process_id=group.process_id, local_device_ids=list(group.local_device_ids or []) or None,
            initialization_timeout=timeout_seconds)
    finally:
        watchdog.cancel()


def _explain_join_timeout(group: ProcessGroup, timeout_seconds: int) -> None:
    expected = f"{group.num_processes} processes" if group.num_processes else "the slice's processes"
    print(f"error: {expected} did not all join the run at {group.coordinator_address or 'the TPU coordinator'} "
          f"within {timeout_seconds} s (from {group.source}); JAX stops this process now. Start every "
          "process with the same coordinator and process count and a distinct --process_id, or raise "
          "--distributed_timeout.", file=sys.stderr, flush=True)


def setup(flags: DistributedFlags) -> ProcessGroup | None:
    """Plans and joins the run's process group; returns it (None for a single process).

    Also quiets the other processes: only process 0 writes logs and metrics.
    """
    group = plan(flags)
    if group is None:
        return None
    initialize(group, timeout_seconds=flags.timeout_seconds)
    if not is_chief():
        import absl.logging  # only to quiet multi-process logging

        absl.logging.set_verbosity(absl.logging.WARNING)
    return group


def is_chief() -> bool:
    """Whether this is process 0, the one that writes logs, metrics and single files."""
    import jax  # jax loads in seconds: imported where first needed, so commands that need no device start fast

    return jax.process_index() == 0
