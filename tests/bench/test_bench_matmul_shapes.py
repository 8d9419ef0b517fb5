"""bench/matmul_shapes.py: the train step's dense matmuls in JAX and PyTorch, at --quick sizes (PyTorch optional)."""

import functools
import time

import jax
import numpy as np
import pytest

from bench import common, matmul_shapes, torch_reference
from bench.__main__ import BENCHMARKS, parser

QUICK = {**matmul_shapes.DEFAULTS, **matmul_shapes.QUICK, "threads": 1}


def test_registered():
    assert BENCHMARKS["matmul_shapes"] is matmul_shapes


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_the_problems_are_every_weight_matmul_of_the_step_forward_and_backward(framework):
    """Three matmuls per weight, each 2 x tokens x the weight's size in FLOPs: 6 x tokens x the
    PyTorch reference model's nn.Linear weights, in either framework's layout."""
    torch = pytest.importorskip("torch")
    model = torch_reference.build_model("llama", QUICK)
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    tokens = QUICK["batch_size"] * QUICK["seq_len"]
    problems = matmul_shapes.step_problems(QUICK, framework)
    assert sum(p.count * p.flops for p in problems) == 6 * tokens * linear_weights
    assert {p.layout for p in problems} == {"nn", "nt", "tn"}


@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_both_frameworks_compute_the_same_product_for_a_layout(layout):
    """A layout names one product on both sides: JAX's dot_general dimension numbers and
    PyTorch's transposed views give numpy's a @ b, a @ b.T or a.T @ b."""
    torch = pytest.importorskip("torch")
    p = matmul_shapes.Problem("test", layout, m=5, k=3, n=4, count=1)
    a_shape, b_shape = matmul_shapes.operand_shapes(p)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32)
    want = {"nn": lambda: a @ b, "nt": lambda: a @ b.T, "tn": lambda: a.T @ b}[layout]()
    got_jax = jax.lax.dot_general(a, b, (matmul_shapes.CONTRACTING[layout], ((), ())))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    got_torch = {"nn": lambda: ta @ tb, "nt": lambda: ta @ tb.t(), "tn": lambda: ta.t() @ tb}[layout]()
    assert want.shape == (5, 4)
    np.testing.assert_allclose(np.asarray(got_jax), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_torch.numpy(), want, rtol=1e-5, atol=1e-5)


def test_quick_run_times_both_frameworks(capsys):
    pytest.importorskip("torch")
    args = parser().parse_args(["matmul_shapes", "--quick", "--threads=1"])
    result = matmul_shapes.run(args, "python -m bench matmul_shapes --quick --threads=1")
    out = capsys.readouterr().out
    assert result["jax_ms"] > 0 and result["torch_ms"] > 0
    assert "mlp down kernel grad" in out and "qkv forward" in out and "q forward" in out
    assert "| timed as |" in out


def test_best_seconds_is_per_call_over_windows_of_at_least_the_minimum():
    """A warm-up call, one call to size the windows, then `repeats` windows of enough calls to
    last `min_window_s`; the best window's seconds per call."""
    calls_seen = []

    def run_calls(calls):
        calls_seen.append(calls)
        time.sleep(0.002 * calls)

    seconds = common.best_seconds(run_calls, repeats=3, min_window_s=0.02)
    assert 0.002 <= seconds < 0.004
    assert calls_seen[:2] == [1, 1] and len(calls_seen) == 5
    assert all(calls > 4 for calls in calls_seen[2:]), calls_seen


def test_a_transposed_jax_problem_counts_the_faster_of_its_layout_and_nn():
    """XLA:CPU may copy a transposed operand into place inside the step and run the 'nn' kernel, so
    a JAX problem counts the faster of the two; each distinct kernel is timed once (an 'nn'
    problem, and an 'nn' shape two problems share); PyTorch's count in their own layout."""
    timed = []
    seconds = {"tn": 2.0, "nt": 0.5, "nn": 1.0}

    def fake_seconds(p, **_):
        timed.append((p.layout, p.m, p.k, p.n))
        return seconds[p.layout]

    problems = [matmul_shapes.Problem("kernel grad", "tn", 4, 3, 2, 1),
                matmul_shapes.Problem("input grad", "nt", 4, 3, 2, 1),
                matmul_shapes.Problem("forward", "nn", 4, 3, 2, 7)]
    time_them = functools.partial(matmul_shapes.time_problems, problems, fake_seconds, repeats=1, min_window_s=0.0)
    assert [(t, layout) for _, t, layout in time_them(also_nn=True)] == [(1.0, "nn"), (0.5, "nt"), (1.0, "nn")]
    assert sorted(timed) == [("nn", 4, 3, 2), ("nt", 4, 3, 2), ("tn", 4, 3, 2)]
    assert [p.count for p, _, _ in time_them(also_nn=True)] == [1, 1, 7]
    timed.clear()
    assert [(t, layout) for _, t, layout in time_them(also_nn=False)] == [(2.0, "tn"), (0.5, "nt"), (1.0, "nn")]
    assert len(timed) == 3
