"""The native CPU batched matmul: equal to numpy's products, inside jit, vmap, scan and sharding;
built once into its cache, with one clear error where it cannot be built."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from t5x_lite import kernels
from t5x_lite.kernels import sgemm_batch as kernel_module


def _operand(rng, batch, rows, cols, transposed):
    return rng.standard_normal(batch + ((cols, rows) if transposed else (rows, cols)), dtype=np.float32)


def _want(a, b, transpose_a, transpose_b):
    return np.matmul(np.swapaxes(a, -1, -2) if transpose_a else a, np.swapaxes(b, -1, -2) if transpose_b else b)


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (False, True), (True, False), (True, True)])
def test_equals_numpy_for_every_transpose_and_batch_shape(batch, transpose_a, transpose_b):
    rng = np.random.default_rng(len(batch))
    m, k, n = 7, 5, 9  # all different: a swapped dimension cannot pass unnoticed
    a = _operand(rng, batch, m, k, transpose_a)
    b = _operand(rng, batch, k, n, transpose_b)
    got = jax.jit(lambda a, b: kernels.batched_matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b))(a, b)
    assert got.shape == batch + (m, n) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), _want(a, b, transpose_a, transpose_b), rtol=1e-5, atol=1e-5)


def test_large_batches_spread_over_threads_equal_numpy():
    """Many matrices (more than the pool has threads), each larger than BLAS's small-matrix path."""
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((2, 8, 96, 48), dtype=np.float32) for _ in range(2))
    got = kernels.batched_matmul(jnp.asarray(a), jnp.asarray(b), transpose_b=True)
    np.testing.assert_allclose(np.asarray(got), _want(a, b, False, True), rtol=1e-4, atol=1e-4)


def test_empty_contraction_gives_zeros_and_empty_batches_give_empty_results():
    ones = jnp.ones((2, 3, 0), jnp.float32)
    np.testing.assert_array_equal(np.asarray(kernels.batched_matmul(ones, jnp.ones((2, 0, 4), jnp.float32))),
                                  np.zeros((2, 3, 4), np.float32))
    assert kernels.batched_matmul(jnp.ones((0, 3, 2)), jnp.ones((0, 2, 4))).shape == (0, 3, 4)


def test_vmap_scan_and_a_sharded_batch():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, 4, 6, 5), dtype=np.float32)
    b = rng.standard_normal((8, 4, 5, 3), dtype=np.float32)
    want = _want(a, b, False, False)
    np.testing.assert_allclose(np.asarray(jax.vmap(kernels.batched_matmul)(a, b)), want, rtol=1e-5, atol=1e-5)

    def body(carry, ab):
        return carry, kernels.batched_matmul(*ab)

    _, scanned = jax.jit(lambda a, b: jax.lax.scan(body, 0, (a, b)))(a, b)
    np.testing.assert_allclose(np.asarray(scanned), want, rtol=1e-5, atol=1e-5)
    # No sharding rule: XLA gathers the operands, and the result is still the products.
    mesh = jax.make_mesh((len(jax.devices()),), ("data",))
    spread = NamedSharding(mesh, PartitionSpec("data"))
    sharded = jax.jit(kernels.batched_matmul)(jax.device_put(a, spread), jax.device_put(b, spread))
    np.testing.assert_allclose(np.asarray(sharded), want, rtol=1e-5, atol=1e-5)


def test_refuses_other_dtypes_and_mismatched_shapes():
    with pytest.raises(TypeError, match="float32"):
        kernels.batched_matmul(jnp.ones((2, 3, 4), jnp.bfloat16), jnp.ones((2, 4, 5), jnp.bfloat16))
    with pytest.raises(ValueError, match="same leading"):
        kernels.batched_matmul(jnp.ones((2, 3, 4)), jnp.ones((3, 4, 5)))
    with pytest.raises(ValueError, match="contracting dims differ"):
        kernels.batched_matmul(jnp.ones((2, 3, 4)), jnp.ones((2, 5, 4)))


def test_built_once_per_source_under_its_final_name(tmp_path, monkeypatch):
    monkeypatch.setenv("T5X_LITE_KERNEL_CACHE", str(tmp_path))
    compiler = kernel_module._compiler()
    first = kernel_module._build(compiler)
    assert first.parent == tmp_path and first.stat().st_size > 0
    built_at = first.stat().st_mtime_ns
    assert kernel_module._build(compiler) == first and first.stat().st_mtime_ns == built_at
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]


def test_a_failed_build_raises_one_error_and_leaves_no_library(tmp_path, monkeypatch):
    failing = tmp_path / "bin" / "broken-c++"
    failing.parent.mkdir()
    failing.write_text("#!/bin/sh\necho 'broken-c++: no such thing' >&2\nexit 1\n")
    failing.chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setenv("T5X_LITE_KERNEL_CACHE", str(cache))
    monkeypatch.setenv("CXX", str(failing))
    with pytest.raises(kernels.KernelUnavailableError, match="(?s)failed.*no such thing.*'explicit'"):
        kernel_module._build(kernel_module._compiler())
    assert list(cache.iterdir()) == []


def test_no_compiler_names_the_fix(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(kernel_module.shutil, "which", lambda name: None)
    with pytest.raises(kernels.KernelUnavailableError, match="C\\+\\+ compiler.*attention_implementation='explicit'"):
        kernel_module._compiler()


def test_cache_dir_follows_the_environment(monkeypatch):
    monkeypatch.delenv("T5X_LITE_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert kernel_module.cache_dir() == Path("/somewhere/t5x_lite/kernels")
    monkeypatch.setenv("T5X_LITE_KERNEL_CACHE", "/elsewhere")
    assert kernel_module.cache_dir() == Path("/elsewhere")


def test_alpha_scales_inside_the_product():
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal((3, 4, 4), dtype=np.float32) for _ in range(2))
    got = kernels.batched_matmul(jnp.asarray(a), jnp.asarray(b), transpose_a=True, alpha=0.125)
    np.testing.assert_allclose(np.asarray(got), 0.125 * _want(a, b, True, False), rtol=1e-5, atol=1e-6)
