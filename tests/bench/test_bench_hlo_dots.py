"""bench/hlo_dots.py: the matmuls of each instruction, read from compiled HLO text."""

import jax
import jax.numpy as jnp

from bench import hlo_dots


def test_the_dots_of_a_compiled_cpu_function_and_their_flops():
    """A plain and a batched matmul compiled by XLA:CPU: each instruction that runs one (a dot, or
    the fusion calling it, both named) is found with its product's sizes; nothing else is."""

    def f(x, w, q, k):
        return jnp.tanh(x @ w), jnp.einsum("bth,bsh->bts", q, k)

    args = (jnp.ones((64, 32)), jnp.ones((32, 48)), jnp.ones((4, 16, 8)), jnp.ones((4, 24, 8)))
    dots = hlo_dots.dots_by_instruction(jax.jit(f).lower(*args).compile().as_text())
    found = {dot for instruction in dots.values() for dot in instruction}
    assert found == {hlo_dots.Dot(batch=1, m=64, k=32, n=48), hlo_dots.Dot(batch=4, m=16, k=8, n=24)}
    assert all(len(instruction) == 1 for instruction in dots.values())
    assert sum(dot.flops for dot in found) == 2 * 64 * 32 * 48 + 2 * 4 * 16 * 8 * 24
    assert hlo_dots.Dot(batch=4, m=16, k=8, n=24).describe() == "4 x 16x8x24"
    assert hlo_dots.Dot(batch=1, m=64, k=32, n=48).describe() == "64x32x48"


_MODULE = """HloModule m, entry_computation_layout={(f32[2,5]{1,0})->f32[2,3]{1,0}}

%fused_computation.1 (param_0.1: f32[2,5], param_1.1: f32[5,3]) -> f32[2,3] {
  %param_0.1 = f32[2,5]{1,0} parameter(0)
  %param_1.1 = f32[5,3]{1,0} parameter(1)
  ROOT %dot.1 = f32[2,3]{1,0} dot(%param_0.1, %param_1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%wrapped_add_computation (param_0.2: s32[], param_1.2: s32[]) -> s32[] {
  %param_0.2 = s32[] parameter(0)
  %param_1.2 = s32[] parameter(1)
  ROOT %add.1 = s32[] add(%param_0.2, %param_1.2)
}

%body (arg_tuple.1: (s32[], /*index=1*/f32[8,8])) -> f32[8,8] {
  %arg_tuple.1 = (s32[], f32[8,8]{1,0}) parameter(0)
  %gte.1 = f32[8,8]{1,0} get-tuple-element(%arg_tuple.1), index=1
  ROOT %dot.5 = f32[8,8]{1,0} dot(%gte.1, %gte.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main.9 (p.1: f32[2,5], w.1: bf16[4,7,6]) -> f32[2,3] {
  %p.1 = f32[2,5]{1,0} parameter(0)
  %c.1 = f32[5,3]{1,0} constant({...})
  %w.1 = bf16[4,7,6]{2,1,0} parameter(1)
  %ynn_fusion.1 = f32[2,3]{1,0} fusion(%p.1, %c.1), kind=kCustom, calls=%fused_computation.1
  %i.1 = s32[] constant(1)
  %wrapped_add.1 = s32[] fusion(%i.1, %i.1), kind=kLoop, calls=%wrapped_add_computation
  %custom-call.2 = (bf16[4,7,7]{2,1,0}, s8[1024]{0}) custom-call(bf16[4,7,6]{2,1,0} %w.1, bf16[4,7,6]{2,1,0} %w.1), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["2"],"rhs_contracting_dimensions":["2"],"lhs_batch_dimensions":["0"],"rhs_batch_dimensions":["0"]}}}
  ROOT %add.2 = f32[2,3]{1,0} add(%ynn_fusion.1, %ynn_fusion.1)
}
"""


def test_a_fusion_counts_the_dots_it_calls_and_a_cublas_call_its_dimensions():
    """A computation header holding `=` (XLA's `/*index=1*/` comments) starts a computation of its
    own: its dot is not one of the add fusion's before it."""
    dots = hlo_dots.dots_by_instruction(_MODULE)
    assert dots == {"dot.1": [hlo_dots.Dot(1, 2, 5, 3)], "ynn_fusion.1": [hlo_dots.Dot(1, 2, 5, 3)],
                    "custom-call.2": [hlo_dots.Dot(4, 7, 6, 7)], "dot.5": [hlo_dots.Dot(1, 8, 8, 8)]}
