"""The name mapping between t5x_lite parameters and Hugging Face tensors, as data.

A `Rule` ties one or more t5x_lite parameters to one or more Hugging Face tensors through a
`Transform` that goes both ways (pure numpy: transposes, reshapes, splits; never arithmetic,
so a round trip is exact). Rules inside a `Stack` are written once per layer: '{i}' in a
tensor name is the layer index, and the parameter path is relative to the layer. `expand`
turns a `Mapping` into concrete `Step`s for a scanned (one array per parameter, layers on axis
0) or unrolled (`layers_unrolled/layers_{i}/...`) model. Each tensor's shape is written as
config.json field expressions ('num_attention_heads*head_dim'), so a size that disagrees with the
tensors is reported by field name.
"""

from __future__ import annotations

import dataclasses
from typing import Callable
from typing import Mapping as MappingType

import numpy as np

from t5x_lite.hf.errors import ConversionError


@dataclasses.dataclass(frozen=True)
class Transform:
    """`to_ours(*hf_tensors) -> tuple` and `to_hf(*our_params) -> tuple`, inverse to each other."""

    to_ours: Callable[..., tuple[np.ndarray, ...]]
    to_hf: Callable[..., tuple[np.ndarray, ...]]
    describe: str


IDENTITY = Transform(lambda x: (x,), lambda x: (x,), "as is")
# torch.nn.Linear keeps [out, in]; a Dense kernel is [in, out].
TRANSPOSE = Transform(lambda x: (x.T,), lambda x: (x.T,), "transposed")


def linear_to_heads(num_heads: int, head_dim: int) -> Transform:
    """torch Linear [heads*head_dim, embed] <-> kernel [embed, heads, head_dim] (q, k, v)."""
    return Transform(lambda w: (w.T.reshape(w.shape[1], num_heads, head_dim),),
                     lambda k: (k.reshape(k.shape[0], num_heads * head_dim).T,),
                     "transposed; out split into (heads, head_dim)")


def linear_from_heads(num_heads: int, head_dim: int) -> Transform:
    """torch Linear [embed, heads*head_dim] <-> kernel [heads, head_dim, embed] (attention output)."""
    return Transform(lambda w: (w.T.reshape(num_heads, head_dim, w.shape[0]),),
                     lambda k: (k.reshape(num_heads * head_dim, k.shape[-1]).T,),
                     "transposed; in split into (heads, head_dim)")


def split_heads(num_heads: int, head_dim: int) -> Transform:
    """A bias [heads*head_dim] <-> [heads, head_dim] (q, k, v biases of a torch Linear)."""
    return Transform(lambda b: (b.reshape(num_heads, head_dim),), lambda b: (b.reshape(num_heads * head_dim),),
                     "split into (heads, head_dim)")


def split_first(num_heads: int, head_dim: int) -> Transform:
    """[heads*head_dim, embed] <-> [heads, head_dim, embed]: GPT-2's Conv1D keeps [in, out], so only a reshape."""
    return Transform(lambda w: (w.reshape(num_heads, head_dim, w.shape[-1]),),
                     lambda k: (k.reshape(num_heads * head_dim, k.shape[-1]),),
                     "in split into (heads, head_dim)")


def fused_qkv(num_heads: int, head_dim: int) -> Transform:
    """GPT-2's c_attn [..., 3*heads*head_dim] <-> query, key, value [..., heads, head_dim] (weights and biases)."""

    def to_ours(x):
        return tuple(part.reshape(*x.shape[:-1], num_heads, head_dim) for part in np.split(x, 3, axis=-1))

    def to_hf(q, k, v):
        return (np.concatenate([a.reshape(*a.shape[:-2], num_heads * head_dim) for a in (q, k, v)], axis=-1),)

    return Transform(to_ours, to_hf, "q, k and v concatenated on the last axis, each split into (heads, head_dim)")


@dataclasses.dataclass(frozen=True)
class Rule:
    """t5x_lite parameters `ours` <-> Hugging Face tensors `hf`, with each tensor's shape as field expressions."""

    ours: tuple[str, ...]
    hf: tuple[str, ...]
    hf_shapes: tuple[tuple[str, ...], ...]
    transform: Transform = IDENTITY


def rule(ours: str | tuple[str, ...], hf: str, shape: tuple[str, ...], transform: Transform = IDENTITY) -> Rule:
    """The common case: one Hugging Face tensor."""
    return Rule(ours if isinstance(ours, tuple) else (ours,), (hf,), (shape,), transform)


@dataclasses.dataclass(frozen=True)
class Stack:
    """`num_layers` blocks under `scope` ('' for a decoder-only LM, 'encoder' or 'decoder' in T5)."""

    scope: str
    num_layers: int
    rules: tuple[Rule, ...]


@dataclasses.dataclass(frozen=True)
class Mapping:
    """Everything a family converts: rules outside the blocks, the stacks of blocks, and the
    Hugging Face tensors that are skipped on reading (buffers, tied copies), as regexes."""

    rules: tuple[Rule, ...]
    stacks: tuple[Stack, ...]
    ignored: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Step:
    """One rule applied once: full parameter paths (indexed at `layer` on axis 0 when scanned)
    and concrete tensor names and shapes."""

    ours: tuple[str, ...]
    layer: int | None
    hf: tuple[str, ...]
    hf_shapes: tuple[tuple[int, ...], ...]
    shape_exprs: tuple[tuple[str, ...], ...]
    transform: Transform


def eval_dim(expr: str, dims: MappingType[str, int]) -> int:
    """'3*n_embd' -> 3 * dims['n_embd']; factors are config field names or integers."""
    value = 1
    for factor in expr.split("*"):
        factor = factor.strip()
        if factor.isdigit():
            value *= int(factor)
        elif factor in dims:
            value *= int(dims[factor])
        else:
            raise ConversionError(f"config.json has no {factor!r}, needed for the size {expr!r}.")
    return value


def describe_shape(exprs: tuple[str, ...], dims: MappingType[str, int]) -> str:
    """'(n_embd=64, 3*n_embd=192)': which fields give a shape, for error messages."""
    return "(" + ", ".join(expr if expr.isdigit() else f"{expr}={eval_dim(expr, dims)}" for expr in exprs) + ")"


def _prefix(scope: str, layer_scope: str) -> str:
    return f"{scope}/{layer_scope}/" if scope else f"{layer_scope}/"


def expand(mapping: Mapping, *, scanned: bool, dims: MappingType[str, int]) -> list[Step]:
    """Every rule of `mapping` made concrete; a stack's rules come rule by rule, each for every layer
    (so a scanned parameter array is read once for all its layers)."""

    def step(r: Rule, ours: tuple[str, ...], layer: int | None, names: tuple[str, ...]) -> Step:
        return Step(ours, layer, names, tuple(tuple(eval_dim(e, dims) for e in s) for s in r.hf_shapes),
                    r.hf_shapes, r.transform)

    steps = [step(r, r.ours, None, r.hf) for r in mapping.rules]
    for stack in mapping.stacks:
        for r in stack.rules:
            for i in range(stack.num_layers):
                names = tuple(n.format(i=i) for n in r.hf)
                if scanned:
                    steps.append(step(r, tuple(_prefix(stack.scope, "layers") + p for p in r.ours), i, names))
                else:
                    ours = tuple(_prefix(stack.scope, f"layers_unrolled/layers_{i}") + p for p in r.ours)
                    steps.append(step(r, ours, None, names))
    return steps


def markdown_table(mapping: Mapping) -> str:
    """The mapping as a markdown table (docs/interop.md shows these; a test keeps them in step)."""
    lines = ["| t5x_lite parameter | Hugging Face tensor | shape (config.json fields) | layout |", "|---|---|---|---|"]

    def add(r: Rule, layer_prefix: str) -> None:
        ours = "<br>".join(f"`{layer_prefix}{p}`" for p in r.ours)
        hf = "<br>".join(f"`{n.replace('{i}', 'N')}`" for n in r.hf)
        shapes = "<br>".join("[" + ", ".join(s) + "]" for s in r.hf_shapes)
        lines.append(f"| {ours} | {hf} | {shapes} | {r.transform.describe} |")

    for r in mapping.rules:
        add(r, "")
    for stack in mapping.stacks:
        for r in stack.rules:
            add(r, _prefix(stack.scope, "layers"))
    return "\n".join(lines)
