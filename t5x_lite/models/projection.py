"""The projection dot of every dense layer, with a backward pass written out.

`project(x, kernel)` is `x @ kernel` over x's last dimensions. Its gradient is the same
math as JAX's own, but arranged so that no large array is transposed:

- JAX's transpose rule computes the kernel gradient as `dot(g, x)` over the batch
  dimensions and then transposes the result. XLA then has to lay the upstream gradient `g`
  ([tokens, features], the largest array of the layer, vocab-wide for the logits) out
  feature-major before the dot, and on CPU it fuses that transpose into the elementwise op
  that produces `g`, which then writes with a stride of a whole row. In the benchmark
  decoder those copies took about 30% of the step (docs/benchmarks.md).
- Here the kernel gradient is `dot(x, g)` over the batch dimensions, which comes out in the
  kernel's own layout [in..., out...]; XLA transposes `x` (narrower than `g` for every MLP
  and logits projection) or nothing at all.

Both gradients are dot_generals with the same contracting dimensions as JAX's, so GSPMD
shards them the same way (the kernel gradient contracts over the sharded batch and is
reduced across data-parallel devices, as before).
"""

from __future__ import annotations

import functools

import jax

Array = jax.Array


def _dims(x_ndim: int, contract_dims: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(x's batch dimensions, x's contracted dimensions)."""
    return tuple(range(x_ndim - contract_dims)), tuple(range(x_ndim - contract_dims, x_ndim))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def project(x: Array, kernel: Array, contract_dims: int = 1) -> Array:
    """x [..., *in] @ kernel [*in, *out] -> [..., *out], `in` being x's last `contract_dims` dimensions."""
    _, contracted = _dims(x.ndim, contract_dims)
    return jax.lax.dot_general(x, kernel, ((contracted, tuple(range(contract_dims))), ((), ())))


def _project_fwd(x: Array, kernel: Array, contract_dims: int):
    return project(x, kernel, contract_dims), (x, kernel)


def _project_bwd(contract_dims: int, residuals, g: Array):
    x, kernel = residuals
    batch, _ = _dims(x.ndim, contract_dims)
    out_dims = kernel.ndim - contract_dims
    g_out = tuple(range(g.ndim - out_dims, g.ndim))
    kernel_out = tuple(range(contract_dims, kernel.ndim))
    dx = jax.lax.dot_general(g, kernel, ((g_out, kernel_out), ((), ())))
    dkernel = jax.lax.dot_general(x, g, ((batch, batch), ((), ())))
    return dx.astype(x.dtype), dkernel.astype(kernel.dtype)


project.defvjp(_project_fwd, _project_bwd)
