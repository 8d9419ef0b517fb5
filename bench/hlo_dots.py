"""The matmuls each instruction of a compiled HLO module runs, read from its text.

`step_profile` times the ops of a traced step; to say how fast each matmul ran inside the
step it needs each op's FLOPs, which the trace does not carry. The compiled module's text
(`compiled.as_text()`) does: a `dot` names its operands and their contracting and batch
dimensions; a fusion (XLA:CPU's `ynn_fusion`s, XLA:GPU's Triton gemm fusions) runs the dots of
the computation it calls; a cuBLAS call (`__cublas$gemm`, `__cublas$lt$matmul`) carries the
dimensions in its backend config. Loops and conditionals are not followed: the ops in their
bodies are events of their own in a trace.
"""

from __future__ import annotations

import dataclasses
import math
import re

from t5x_lite.estimate import collectives

# `[ROOT ]%name = shape opcode(operands), attributes`; a shape may be a tuple.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\(.*?\)|[\w]+\[[\d,]*\](?:\{[^}]*\})?)\s+"
                          r"([\w\-]+)\((.*?)\)(.*)$")
_ARRAY = re.compile(r"\w+\[([\d,]*)\]")
_CUBLAS = re.compile(r'custom_call_target="__cublas\$(?:lt\$matmul|gemm)"')


@dataclasses.dataclass(frozen=True)
class Dot:
    """One matmul: `batch` independent [m, k] @ [k, n] products."""

    batch: int
    m: int
    k: int
    n: int

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n

    def describe(self) -> str:
        product = f"{self.m}x{self.k}x{self.n}"
        return f"{self.batch} x {product}" if self.batch > 1 else product


def _dims(shape: str) -> list[int]:
    match = _ARRAY.match(shape)
    return [int(d) for d in match.group(1).split(",") if d] if match else []


def _field(attributes: str, name: str) -> list[int]:
    """`name={1,2}` (HLO attribute) or `"name":["1","2"]` (backend config JSON) as ints."""
    match = re.search(rf'{name}=\{{([\d,]*)\}}', attributes) or re.search(rf'"{name}":\[([^\]]*)\]', attributes)
    return [int(d) for d in re.findall(r"\d+", match.group(1))] if match else []


def _operand_shapes(operands: str, shapes: dict[str, str]) -> list[str]:
    """Each operand's shape: printed before its name, or that of the instruction it names."""
    found = []
    for operand in re.findall(r"(?:(\w+\[[\d,]*\])(?:\{[^}]*\})?\s+)?%([\w.\-]+)", operands):
        shape, name = operand
        found.append(shape or shapes.get(name, ""))
    return found


def _dot(lhs: str, rhs: str, attributes: str, cublas: bool) -> Dot | None:
    prefix = "_dimensions" if cublas else "_dims"
    lhs_dims, rhs_dims = _dims(lhs), _dims(rhs)
    if not lhs_dims or not rhs_dims:
        return None
    lhs_batch, lhs_contract = _field(attributes, "lhs_batch" + prefix), _field(attributes, "lhs_contracting" + prefix)
    rhs_batch, rhs_contract = _field(attributes, "rhs_batch" + prefix), _field(attributes, "rhs_contracting" + prefix)
    size = lambda dims, axes: math.prod(dims[a] for a in axes)  # noqa: E731
    free = lambda dims, used: math.prod(d for a, d in enumerate(dims) if a not in used)  # noqa: E731
    return Dot(batch=size(lhs_dims, lhs_batch), m=free(lhs_dims, {*lhs_batch, *lhs_contract}),
               k=size(lhs_dims, lhs_contract), n=free(rhs_dims, {*rhs_batch, *rhs_contract}))


def dots_by_instruction(hlo_text: str) -> dict[str, list[Dot]]:
    """Every instruction that is a matmul or a fusion calling matmuls, by name, with its dots."""
    own: dict[str, list[Dot]] = {}  # every instruction: the dot it is itself, if any
    calls: dict[str, str] = {}  # fusion -> the computation it calls
    members: dict[str, list[str]] = {}  # computation -> its instructions
    for computation, lines in collectives.computations(hlo_text)[0].items():
        instructions = [match.groups() for line in lines if (match := _INSTRUCTION.match(line))]
        shapes = {name: shape for name, shape, *_ in instructions}
        members[computation] = list(shapes)
        for name, _, opcode, operands, attributes in instructions:
            own[name] = []
            cublas = opcode == "custom-call" and bool(_CUBLAS.search(attributes))
            if opcode == "dot" or cublas:
                lhs, rhs, *_ = _operand_shapes(operands, shapes) + ["", ""]
                own[name] = [dot] if (dot := _dot(lhs, rhs, attributes, cublas)) else []
            elif opcode == "fusion" and (called := re.search(r"calls=%?([\w.\-]+)", attributes)):
                calls[name] = called.group(1)

    def dots_of(name: str, seen: frozenset = frozenset()) -> list[Dot]:
        found = list(own[name])
        if (computation := calls.get(name)) is not None and computation not in seen:
            for inner in members.get(computation, []):
                found += dots_of(inner, seen | {computation})
        return found

    return {name: dots for name in own if (dots := dots_of(name))}
