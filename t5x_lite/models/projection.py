"""The projection dot of every dense layer, with a backward pass written out.

`project(x, kernel)` is `x @ kernel` over x's last dimensions. Its gradient is the same
math as JAX's own, but arranged so that no large array is transposed:

- JAX's transpose rule computes the kernel gradient as `dot(g, x)` over the batch
  dimensions and then transposes the result. XLA then has to lay the upstream gradient `g`
  ([tokens, features], the largest array of the layer, vocab-wide for the logits) out
  feature-major before the dot, and on CPU it fuses that transpose into the elementwise op
  that produces `g`, which then writes with a stride of a whole row. In the benchmark
  decoder those copies took about 30% of the step (bench/NOTES.md).
- Here the kernel gradient is `dot(x, g)` over the batch dimensions, which comes out in the
  kernel's own layout [in..., out...]; XLA transposes `x` (narrower than `g` for every MLP
  and logits projection) or nothing at all.

Both gradients are dot_generals with the same contracting dimensions as JAX's, so GSPMD
shards them the same way (the kernel gradient contracts over the sharded batch and is
reduced across data-parallel devices, as before).

The kernel comes in as the float32 parameter itself, with the dtype to cast it to and its logical
axes: the forward pass saves the parameter, which a scan over layers already holds, and the
backward pass constrains and casts it again. Saving the cast kernel instead made the scan stack a
bfloat16 copy of every layer's weights for the backward pass (without remat), and XLA:CPU a
float32 copy of that (bench/NOTES.md, large models).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from flax.linen import partitioning as nn_partitioning

Array = jax.Array


def _dims(x_ndim: int, contract_dims: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(x's batch dimensions, x's contracted dimensions)."""
    return tuple(range(x_ndim - contract_dims)), tuple(range(x_ndim - contract_dims, x_ndim))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def project(x: Array, kernel: Array, contract_dims: int = 1, dtype: Any = None,
            axes: tuple[str | None, ...] | None = None) -> Array:
    """x [..., *in] @ kernel [*in, *out] -> [..., *out], `in` being x's last `contract_dims` dimensions.

    dtype: what the kernel is cast to for the dot (None: as it is); axes: the kernel's logical axis
    names, applied as a sharding constraint before the cast (None: none).
    """
    _, contracted = _dims(x.ndim, contract_dims)
    return jax.lax.dot_general(x, _prepared(kernel, dtype, axes), ((contracted, tuple(range(contract_dims))), ((), ())))


def _constrained(a: Array, axes: tuple[str | None, ...] | None) -> Array:
    """`a` constrained to the kernel's logical axes (as `param_with_axes` constrains a parameter)."""
    return a if axes is None else nn_partitioning.with_sharding_constraint(a, jax.sharding.PartitionSpec(*axes))


def _prepared(kernel: Array, dtype: Any, axes: tuple[str | None, ...] | None) -> Array:
    """The kernel as the dot takes it: constrained to its logical axes, then cast."""
    kernel = _constrained(kernel, axes)
    return kernel if dtype is None else kernel.astype(dtype)


def _project_fwd(x: Array, kernel: Array, contract_dims: int, dtype: Any, axes):
    # Saves the kernel as it came in, not constrained and cast: inside a scan over layers the
    # parameter slice itself is then all the backward pass needs (JAX forwards it from the stacked
    # parameters), where a derived copy would be stacked as a new array for every layer.
    return project(x, kernel, contract_dims, dtype, axes), (x, kernel)


def _project_bwd(contract_dims: int, dtype: Any, axes, residuals, g: Array):
    x, kernel = residuals
    batch, _ = _dims(x.ndim, contract_dims)
    out_dims = kernel.ndim - contract_dims
    g_out = tuple(range(g.ndim - out_dims, g.ndim))
    kernel_out = tuple(range(contract_dims, kernel.ndim))
    prepared = _prepared(kernel, dtype, axes)
    dx = jax.lax.dot_general(g, prepared, ((g_out, kernel_out), ((), ())))
    # Rounded to the cast dtype and constrained like the kernel, as autodiff of the cast and the
    # constraint would do to the gradient.
    dkernel = jax.lax.dot_general(x, g, ((batch, batch), ((), ()))).astype(prepared.dtype).astype(kernel.dtype)
    return dx.astype(x.dtype), _constrained(dkernel, axes)


project.defvjp(_project_fwd, _project_bwd)
