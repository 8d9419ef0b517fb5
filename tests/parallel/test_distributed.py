"""distributed.py: the multi-process flags, the process group they (or SLURM's environment) give,
the coordinator probe, a real 2-process run over gloo, and the train CLI's bad multi-process input.

The SLURM environments below are those measured on SLURM 22.05: a task inside `srun` sees the
step's variables (SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, ...); the batch script itself sees
SLURM_NTASKS, SLURM_PROCID=0 and SLURM_LOCALID=0 but no step variables.
"""

from __future__ import annotations

import json
import socket
import textwrap
import time

import pytest

from t5x_lite.parallel import distributed
from t5x_lite.parallel.distributed import (
    CoordinatorUnreachableError,
    DistributedConfigError,
    DistributedFlags,
    ProcessGroup,
)
from tests.cli.test_bad_input import assert_bad_input
from tests.cli_helpers import run_cli_in_process, run_processes, train, train_in_process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_port(job_id: int) -> int:
    """The coordinator port of a SLURM job, as distributed.py derives it: the top 4096 ports."""
    return 65535 - 4096 + 1 + job_id % 4096


# -- parse_flags -----------------------------------------------------------------------------------

def test_parse_flags_takes_out_its_flags_and_keeps_the_rest_in_order():
    args = ["--gin_file=a.gin", "--coordinator_address=10.0.0.1:1234", "--gin.X=1", "--num_processes=4",
            "positional", "--process_id=3", "--distributed=off", "--distributed_timeout=7", "--other=2",
            "--coordinator_address_extra=5"]
    flags, rest = distributed.parse_flags(args)
    assert flags == DistributedFlags(coordinator_address="10.0.0.1:1234", num_processes=4, process_id=3,
                                     mode="off", timeout_seconds=7)
    assert rest == ["--gin_file=a.gin", "--gin.X=1", "positional", "--other=2", "--coordinator_address_extra=5"]


def test_parse_flags_defaults():
    flags, rest = distributed.parse_flags(["--gin.MODEL_DIR='x'"])
    assert flags == DistributedFlags(coordinator_address=None, num_processes=None, process_id=None,
                                     mode="auto", timeout_seconds=300)
    assert rest == ["--gin.MODEL_DIR='x'"]


@pytest.mark.parametrize("arg, names", [
    ("--num_processes=two", ["--num_processes", "'two'", "not an integer"]),
    ("--process_id=1.5", ["--process_id", "not an integer"]),
    ("--distributed_timeout=soon", ["--distributed_timeout", "not an integer"]),
    ("--distributed=maybe", ["--distributed", "'maybe'", "auto or off"]),
    ("--distributed_timeout=0", ["--distributed_timeout=0", "positive"]),
    ("--distributed_timeout=-5", ["--distributed_timeout=-5", "positive"]),
    ("--coordinator_address=", ["--coordinator_address", "needs a value"]),
    ("--num_processes", ["--num_processes", "needs a value"]),
    ("--distributed", ["--distributed", "needs a value"]),
])
def test_parse_flags_refuses_bad_values_naming_the_flag(arg, names):
    with pytest.raises(DistributedConfigError) as e:
        distributed.parse_flags(["--gin.X=1", arg])
    for name in names:
        assert name in str(e.value), (name, str(e.value))


# -- plan --------------------------------------------------------------------------------------------

def flags(**kw) -> DistributedFlags:
    return DistributedFlags(**kw)


def test_plan_from_explicit_flags():
    group = distributed.plan(flags(coordinator_address="10.0.0.1:1234", num_processes=2, process_id=1), environ={})
    assert group == ProcessGroup(source="flags", coordinator_address="10.0.0.1:1234", num_processes=2,
                                 process_id=1, local_device_ids=None)


def test_plan_explicit_flags_win_over_slurm():
    environ = srun_environ(num_tasks=2, procid=1)
    group = distributed.plan(flags(coordinator_address="h:5", num_processes=3, process_id=2), environ=environ)
    assert (group.source, group.coordinator_address, group.num_processes, group.process_id) == ("flags", "h:5", 3, 2)


@pytest.mark.parametrize("given, missing", [
    (dict(num_processes=2), ["--coordinator_address", "--process_id"]),
    (dict(coordinator_address="h:1", process_id=0), ["--num_processes"]),
    (dict(process_id=0), ["--coordinator_address", "--num_processes"]),
])
def test_plan_needs_all_three_flags(given, missing):
    with pytest.raises(DistributedConfigError) as e:
        distributed.plan(flags(**given), environ={})
    message = str(e.value)
    tail = message.split("missing", 1)[1]
    for name in missing:
        assert name in tail, message
    for name in {"--coordinator_address", "--num_processes", "--process_id"} - set(missing):
        assert name not in tail, message


@pytest.mark.parametrize("process_id, num_processes, hint", [(2, 2, "use 0 to 1"), (-1, 2, "use 0 to 1"),
                                                             (5, 4, "use 0 to 3")])
def test_plan_process_id_out_of_range(process_id, num_processes, hint):
    with pytest.raises(DistributedConfigError) as e:
        distributed.plan(flags(coordinator_address="h:1", num_processes=num_processes, process_id=process_id),
                         environ={})
    assert f"--process_id={process_id} is out of range" in str(e.value)
    assert hint in str(e.value)


def test_plan_needs_at_least_one_process():
    with pytest.raises(DistributedConfigError, match="--num_processes=0"):
        distributed.plan(flags(coordinator_address="h:1", num_processes=0, process_id=0), environ={})


@pytest.mark.parametrize("address", ["nohostport", "host:99999", "host:0", ":1234", "host:", "host:port"])
def test_plan_refuses_a_bad_address(address):
    with pytest.raises(DistributedConfigError) as e:
        distributed.plan(flags(coordinator_address=address, num_processes=2, process_id=0), environ={})
    assert f"--coordinator_address={address!r}" in str(e.value) and "HOST:PORT" in str(e.value)


def test_check_address_reads_host_and_port():
    assert distributed.check_address("10.0.0.1:1234", name="x") == ("10.0.0.1", 1234)
    assert distributed.check_address("[::1]:65535", name="x") == ("::1", 65535)


def test_plan_off_ignores_slurm():
    environ = srun_environ(num_tasks=2, procid=0)
    assert distributed.plan(flags(), environ=environ) is not None  # the same environment joins with auto
    assert distributed.plan(flags(mode="off"), environ=environ) is None


def test_plan_single_process_without_flags_or_cluster():
    assert not distributed.on_cloud_tpu_vm()  # this machine has no Google TPU on its PCI bus
    assert distributed.plan(flags(), environ={}) is None
    assert distributed.plan(flags(), environ=batch_script_environ()) is None


# -- SLURM ----------------------------------------------------------------------------------------------

def batch_script_environ(job_id: int = 4242) -> dict[str, str]:
    """What the batch script of a 2-task job sees outside srun."""
    return {"SLURM_JOB_ID": str(job_id), "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "node[001-002]", "SLURM_TASKS_PER_NODE": "1(x2)",
            "SLURM_JOB_NUM_NODES": "2"}


def srun_environ(*, num_tasks: int = 2, procid: int = 0, localid: int | None = None, nodeid: int = 0,
                 nodelist: str = "node[001-002]", tasks_per_node: str = "1(x2)", job_id: int = 4242,
                 **extra: str) -> dict[str, str]:
    """What task `procid` of an `srun` step sees."""
    return {**batch_script_environ(job_id), "SLURM_STEP_NUM_TASKS": str(num_tasks), "SLURM_NTASKS": str(num_tasks),
            "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(procid if localid is None else localid),
            "SLURM_NODEID": str(nodeid), "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
            "SLURM_STEP_ID": "0", **extra}


def test_slurm_batch_script_is_a_single_process():
    # Outside srun, SLURM_NTASKS=2 and SLURM_PROCID=0: joining would wait for a second process forever.
    assert distributed.slurm_group(batch_script_environ()) is None


@pytest.mark.parametrize("procid", [0, 1])
def test_slurm_two_task_step(procid):
    group = distributed.slurm_group(srun_environ(num_tasks=2, procid=procid, localid=procid,
                                                 nodelist="gpu[07-08]", tasks_per_node="2", job_id=123456))
    assert group.source == "slurm"
    assert (group.num_processes, group.process_id) == (2, procid)
    assert group.coordinator_address == f"gpu07:{slurm_port(123456)}"
    assert 61440 <= slurm_port(123456) <= 65535
    assert group.local_device_ids == (procid,)  # 2 tasks on the node: each drives the GPU of its local rank


def test_slurm_port_differs_between_jobs():
    a = distributed.slurm_group(srun_environ(job_id=1000)).coordinator_address
    b = distributed.slurm_group(srun_environ(job_id=1001)).coordinator_address
    assert a != b and a.split(":")[0] == b.split(":")[0] == "node001"


def test_slurm_coordinator_port_override():
    group = distributed.slurm_group(srun_environ(JAX_COORDINATOR_PORT="23456"))
    assert group.coordinator_address == "node001:23456"


def test_slurm_one_task_step_is_a_single_process():
    assert distributed.slurm_group(srun_environ(num_tasks=1, procid=0, nodelist="node001", tasks_per_node="1")) is None


def test_slurm_process_id_out_of_range():
    with pytest.raises(DistributedConfigError, match="out of range"):
        distributed.slurm_group(srun_environ(num_tasks=2, procid=2))


@pytest.mark.parametrize("node_list, first", [
    ("node001", "node001"),
    ("node[001-004]", "node001"),
    ("gpu[3,7-9],cpu1", "gpu3"),
    ("a-b-c[10-12]", "a-b-c10"),
    ("cpu1,gpu[3-4]", "cpu1"),
])
def test_first_slurm_host(node_list, first):
    assert distributed.first_slurm_host(node_list) == first


@pytest.mark.parametrize("spec, node, tasks", [
    ("8(x4)", 0, 8), ("8(x4)", 3, 8),
    ("4(x2),2", 0, 4), ("4(x2),2", 1, 4), ("4(x2),2", 2, 2),
    ("2", 0, 2),
])
def test_tasks_on_node(spec, node, tasks):
    assert distributed.tasks_on_node(spec, node) == tasks


def test_tasks_on_node_refuses_what_it_cannot_read():
    with pytest.raises(DistributedConfigError, match="tasks per node"):
        distributed.tasks_on_node("8(y4)", 0)


def test_slurm_local_devices():
    # One task per node (each drives all its GPUs): JAX's default, every visible GPU.
    one_per_node = srun_environ(num_tasks=2, procid=1, localid=0, nodeid=1, tasks_per_node="1(x2)")
    assert distributed.slurm_group(one_per_node).local_device_ids is None
    # 8 tasks per node: task with local rank 5 drives GPU 5.
    eight = srun_environ(num_tasks=16, procid=13, localid=5, nodeid=1, tasks_per_node="8(x2)")
    group = distributed.slurm_group(eight)
    assert group.local_device_ids == (5,) and group.process_id == 13 and group.num_processes == 16
    # ...also when all 8 are visible to every task.
    assert distributed.slurm_group({**eight, "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}).local_device_ids == (5,)
    # SLURM bound one GPU to the task (--gpus-per-task=1): it is the task's only device.
    assert distributed.slurm_group({**eight, "CUDA_VISIBLE_DEVICES": "3"}).local_device_ids is None
    # Uneven nodes: node 2 of '4(x2),1' runs one task.
    uneven = srun_environ(num_tasks=9, procid=8, localid=0, nodeid=2, tasks_per_node="4(x2),1")
    assert distributed.slurm_group(uneven).local_device_ids is None


# -- wait_for_coordinator ----------------------------------------------------------------------------------

def test_wait_for_coordinator_returns_when_something_listens():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        start = time.monotonic()
        distributed.wait_for_coordinator(f"127.0.0.1:{server.getsockname()[1]}", timeout_seconds=5)
        assert time.monotonic() - start < 1


def test_wait_for_coordinator_times_out_naming_the_address():
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(CoordinatorUnreachableError) as e:
        distributed.wait_for_coordinator(address, timeout_seconds=1, poll_seconds=0.2)
    elapsed = time.monotonic() - start
    assert 1 <= elapsed < 4, elapsed
    assert address in str(e.value) and "--distributed_timeout" in str(e.value)


# -- two real processes ------------------------------------------------------------------------------------

JOIN = textwrap.dedent("""
    import json, sys
    from t5x_lite.parallel import distributed
    flags, rest = distributed.parse_flags(sys.argv[1:])
    assert rest == [], rest
    group = distributed.setup(flags)
    import jax
    from jax.experimental import multihost_utils
    indices = multihost_utils.process_allgather(jax.numpy.array(jax.process_index()))
    print("RESULT " + json.dumps({"source": group.source, "gathered": [int(i) for i in indices],
                                  "process_index": jax.process_index(), "process_count": jax.process_count(),
                                  "device_count": jax.device_count(),
                                  "local_device_count": jax.local_device_count()}), flush=True)
""")


def test_two_processes_join_and_all_gather(tmp_path):
    results = run_processes(["-c", JOIN], tmp_path, port=free_port(), timeout=90)
    for i, (code, stdout, stderr) in enumerate(results):
        assert code == 0, (i, stdout, stderr[-3000:])
        lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
        assert len(lines) == 1, (i, stdout, stderr[-3000:])
        assert json.loads(lines[0].removeprefix("RESULT ")) == {
            "source": "flags", "gathered": [0, 1], "process_index": i, "process_count": 2, "device_count": 2,
            "local_device_count": 1}, (i, lines[0])


# -- the train CLI -------------------------------------------------------------------------------------------

def test_train_refuses_an_unreachable_coordinator(data_dir, tmp_path):
    model_dir = tmp_path / "run"
    start = time.monotonic()
    result = train(data_dir, model_dir, "--gin.TRAIN_STEPS=2", f"--coordinator_address=127.0.0.1:{free_port()}",
                   "--num_processes=2", "--process_id=1", "--distributed_timeout=2")
    assert time.monotonic() - start < 30
    assert_bad_input(result, "did not answer within 2 s", "--distributed_timeout")
    assert not model_dir.exists()


def test_train_refuses_a_process_id_out_of_range(data_dir, tmp_path):
    model_dir = tmp_path / "run"
    result = train_in_process(data_dir, model_dir, "--gin.TRAIN_STEPS=2", "--process_id=2", "--num_processes=2",
                              "--coordinator_address=127.0.0.1:1234")
    assert_bad_input(result, "--process_id=2 is out of range", "use 0 to 1")
    assert not model_dir.exists()


def test_train_refuses_incomplete_multi_process_flags(data_dir, tmp_path):
    model_dir = tmp_path / "run"
    result = train_in_process(data_dir, model_dir, "--gin.TRAIN_STEPS=2", "--num_processes=2")
    assert_bad_input(result, "missing --coordinator_address, --process_id")
    assert not model_dir.exists()


def test_train_help_lists_the_multi_process_flags():
    result = run_cli_in_process("train", "--help")
    assert result.returncode == 0, result.stderr[-3000:]
    for flag in ("--coordinator_address", "--num_processes", "--process_id", "--distributed", "--distributed_timeout"):
        assert flag in result.stdout, flag


@pytest.mark.parametrize("name, value", [("SLURM_STEP_NUM_TASKS", "two"), ("SLURM_PROCID", "x"),
                                         ("SLURM_JOB_ID", ""), ("SLURM_NODEID", "5")])
def test_unreadable_slurm_variables_are_a_clear_error(name, value):
    environ = srun_environ(tasks_per_node="2", CUDA_VISIBLE_DEVICES="0,1")
    with pytest.raises(distributed.DistributedConfigError, match=name):
        distributed.slurm_group({**environ, name: value})
