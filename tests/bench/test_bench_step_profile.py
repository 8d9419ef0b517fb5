"""bench/step_profile.py: op kinds by name, own time of nested trace events, a traced --quick step on CPU."""

import pytest

from bench import hlo_dots, step_profile
from bench.__main__ import BENCHMARKS
from tests.bench_helpers import run_bench


@pytest.mark.parametrize("name,kind", [
    ("ynn_fusion.12", "matmuls"),  # XLA:CPU, YNNPACK
    ("dot_general", "matmuls"),
    ("nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN", "matmuls"),  # XLA:GPU, cuBLAS
    ("gemm_fusion_dot_508", "matmuls"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64", "attention (cuDNN)"),
    ("bitcast_dynamic-update-slice_fusion.20", "stack writes (dynamic-update-slice)"),
    ("dynamic-slice_dynamic-update-slice_fusion.3", "stack writes (dynamic-update-slice)"),
    ("loop_dynamic_update_slice_fusion_4", "stack writes (dynamic-update-slice)"),
    ("dynamic-slice_bitcast_fusion.11", "stack reads (dynamic-slice)"),
    ("wrapped_broadcast.6", "fills (broadcast, memset)"),
    ("Memset 0", "fills (broadcast, memset)"),
    ("copy_bitcast_fusion.3", "copies and transposes"),
    ("memcpy32_post", "copies and transposes"),
    ("input_add_reduce_fusion", "reductions"),
    ("input_concatenate_fusion_47", "concatenates"),
    ("while.50", "loop and conditional control"),
    ("broadcast_select_fusion.1", "elementwise and other"),
    ("loop_multiply_fusion_72", "elementwise and other"),
])
def test_op_kind_by_name(name, kind):
    assert step_profile.op_kind(name) == kind


def test_op_family_drops_the_number():
    assert step_profile.op_family("ynn_fusion.12") == "ynn_fusion"
    assert step_profile.op_family("loop_add_fusion_82") == "loop_add_fusion"
    assert step_profile.op_family("wrapped_add") == "wrapped_add"


def _meta(pid, tid, process, thread):
    return [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": process}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}}]


def _op(pid, tid, name, ts, dur):
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur}


def test_cpu_ops_count_their_own_time_and_the_runtime_inside_them():
    """A loop's event contains its body's ops, the thunk executor's events contain ops: each op
    counts its own time; a runtime event's own time counts for the op it is nested in (the
    executor running the loop's body for the loop, a matmul's wait for its workers for the
    matmul) and for nothing outside ops; the Python thread's events do not count."""
    trace = {"traceEvents": [
        *_meta(1, 10, "/host:CPU", "tf_XLAEigen/123"), *_meta(1, 11, "/host:CPU", "python"),
        _op(1, 10, "while.3", 0, 100), _op(1, 10, "ynn_fusion.1", 10, 30),
        _op(1, 10, "SlinkyThreadPool::Await", 30, 8),
        _op(1, 10, "ThunkExecutor::Execute", 50, 40), _op(1, 10, "add_fusion", 55, 10),
        _op(1, 10, "end: copy.2", 120, 5), _op(1, 10, "ThunkExecutor::Execute", 130, 20),
        _op(1, 11, "PjitFunction(_train_step_fn)", 0, 200), _op(1, 11, "ynn_fusion.9", 0, 50),
    ]}
    assert dict(step_profile.device_op_times(trace)) == {"while.3": 60, "ynn_fusion.1": 30, "add_fusion": 10,
                                                         "copy.2": 5}


def test_wall_time_is_shared_by_the_ops_running_side_by_side():
    """Two matmuls on two threads overlap for 20 us: each gets half of it; the times add up to the
    time any op ran (60 us of the 80 us span)."""
    trace = {"traceEvents": [
        *_meta(1, 10, "/host:CPU", "tf_XLAEigen/1"), *_meta(1, 11, "/host:CPU", "tf_XLAEigen/2"),
        _op(1, 10, "ynn_fusion.1", 0, 40), _op(1, 11, "ynn_fusion.2", 20, 30), _op(1, 10, "add_fusion", 70, 10),
    ]}
    segments = step_profile.device_segments(trace)
    assert dict(step_profile.wall_times(segments)) == {"ynn_fusion.1": 30, "ynn_fusion.2": 20, "add_fusion": 10}
    assert dict(step_profile.device_op_times(trace)) == {"ynn_fusion.1": 40, "ynn_fusion.2": 30, "add_fusion": 10}
    assert dict(step_profile.alone_times(segments)) == {"ynn_fusion.1": 20, "ynn_fusion.2": 10, "add_fusion": 10}


def test_an_op_on_two_threads_with_nothing_beside_it_runs_alone():
    """A loop fusion split over two threads is one op: alone while nothing else runs (0-10 us),
    not while a matmul runs beside one of its halves (10-15 us)."""
    trace = {"traceEvents": [
        *_meta(1, 10, "/host:CPU", "tf_XLAEigen/1"), *_meta(1, 11, "/host:CPU", "tf_XLAEigen/2"),
        _op(1, 10, "add_fusion.3", 0, 10), _op(1, 11, "add_fusion.3", 0, 15), _op(1, 10, "ynn_fusion.1", 10, 10),
    ]}
    segments = step_profile.device_segments(trace)
    assert dict(step_profile.alone_times(segments)) == {"add_fusion.3": 10, "ynn_fusion.1": 5}
    assert dict(step_profile.wall_times(segments)) == pytest.approx({"add_fusion.3": 12.5, "ynn_fusion.1": 7.5})


def test_a_device_trace_counts_the_streams_only():
    trace = {"traceEvents": [
        *_meta(1, 7, "/device:GPU:0", "Stream #14(Memset,Compute)"), *_meta(2, 3, "/host:CPU", "tf_XLAEigen/1"),
        _op(1, 7, "nvjet_sm90_tst", 0, 40), _op(1, 7, "loop_add_fusion_2", 40, 10),
        _op(2, 3, "ynn_fusion.1", 0, 99),
    ]}
    times = step_profile.device_op_times(trace)
    assert dict(times) == {"nvjet_sm90_tst": 40, "loop_add_fusion_2": 10}
    wall = step_profile.wall_times(step_profile.device_segments(trace))
    kinds, families, total = step_profile.summarize(times, wall, steps=2, top=5)
    assert kinds == [["matmuls", "0.02", "80.0%", "0.02"], ["elementwise and other", "0.01", "20.0%", "0.01"]]
    assert total == pytest.approx(0.025)
    assert families[0] == ["nvjet_sm90_tst", "matmuls", 1, "0.02", "80.0%", "0.02"]


def test_matmul_rows_give_each_matmul_op_its_speed_while_running_and_its_wall_time():
    """Two calls of a 1-GFLOP matmul per step, 10 ms each, half of one beside an add: 100 GFLOP/s
    while running, 17.5 ms of wall time per step, 15 ms alone; XLA:CPU's completion event of an op
    is no call."""
    trace = {"traceEvents": [
        *_meta(1, 10, "/host:CPU", "tf_XLAEigen/1"), *_meta(1, 11, "/host:CPU", "tf_XLAEigen/2"),
        _op(1, 10, "ynn_fusion.1", 0, 10_000), _op(1, 10, "end: ynn_fusion.1", 10_000, 0),
        _op(1, 11, "add_fusion", 5_000, 5_000), _op(1, 10, "ynn_fusion.1", 20_000, 10_000),
    ]}
    dot = hlo_dots.Dot(batch=1, m=1000, k=500, n=1000)
    rows, totals = step_profile.matmul_rows(step_profile.device_segments(trace), {"ynn_fusion.1": [dot]},
                                            steps=1, top=5)
    assert rows == [["ynn_fusion.1", "1000x500x1000", "2", "10.00", "100.0", "17.50", "15.00"]]
    assert totals == pytest.approx({"gflop": 2.0, "wall_ms": 17.5, "gflops": 2.0 / 17.5e-3})


def _run(*extra):
    return run_bench("step_profile", "--quick", *extra)


def test_quick_profile_of_the_scanned_and_the_loop_free_step():
    """The traced CPU step has matmuls; the scanned one writes and reads its stacks, the one
    with every layer in one iteration (scan_unroll = the 2 layers) does not."""
    assert BENCHMARKS["step_profile"] is step_profile
    scanned, out = _run("--scan_unroll=1")
    loop_free, _ = _run("--scan_unroll=2")
    for result in (scanned, loop_free):
        assert result["kinds"]["matmuls"] > 0
        assert result["op_ms"] > 0 and result["wall_ms"] > 0  # op time: every host device's threads, summed
    assert scanned["kinds"]["stack writes (dynamic-update-slice)"] > 0
    assert scanned["kinds"]["stack reads (dynamic-slice)"] > 0
    assert not {"stack writes (dynamic-update-slice)", "stack reads (dynamic-slice)"} & set(loop_free["kinds"])
    lines = out.strip().splitlines()
    assert lines[0].startswith("**") and "command: `python -m bench step_profile --quick" in lines[0]
    assert "| kind" in out and "| op (without its number)" in out and "| products (batch x m x k x n)" in out
    for result in (scanned, loop_free):  # the tiny step's dots, each counted once per call
        flops = step_profile.common.flops_per_token(step_profile.model_config(result["settings"]),
                                                    result["settings"]["seq_len"])
        tokens = result["settings"]["batch_size"] * result["settings"]["seq_len"]
        assert result["matmuls"]["gflop"] == pytest.approx(flops * tokens / 1e9, rel=0.02)
        assert result["matmuls"]["wall_ms"] > 0
    assert lines[-1].startswith("settings: ")
