"""The collectives of a compiled program, read from its HLO text: how many, how many bytes, and where.

XLA inserts the all-gathers, reduce-scatters and all-reduces that a mesh and its sharding rules
imply; scanned layers run as `while` loops, so the collectives inside a loop's body run once per
layer (per trip). `collectives(hlo_text)` groups them by the loop whose body holds them (its
trip count from XLA's `known_trip_count`) and the rest of the program ("outside"). Bytes are
those of each collective's result on one device. Pure text parsing: no JAX needed.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Iterator

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\(")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations|called_computations)=\{?([^}\s,]+"
                     r"(?:,\s*%?[\w.\-]+)*)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


@dataclasses.dataclass
class Group:
    """Collectives of one part of the program: per kind, (count, bytes per device)."""

    trips: int = 1
    counts: Counter = dataclasses.field(default_factory=Counter)
    bytes: Counter = dataclasses.field(default_factory=Counter)


def result_bytes(shape_text: str) -> int:
    """Bytes of an HLO result shape (an array or a tuple of arrays)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape_text):
        elements = 1
        for d in filter(None, dims.split(",")):
            elements *= int(d)
        total += elements * _DTYPE_BYTES[dtype]
    return total


def computations(hlo_text: str) -> tuple[dict[str, list[str]], str]:
    """{computation name: its instruction lines}, and the entry computation's name, of a module's
    HLO text (`compiled.as_text()`)."""
    out: dict[str, list[str]] = {}
    entry, current = "", None
    for line in hlo_text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header and not line.startswith(" "):
                current = header.group(1)
                out[current] = []
                entry = current if line.startswith("ENTRY") else entry
        elif line.startswith("}"):
            current = None
        else:
            out[current].append(line)
    return out, entry


def _called(line: str) -> Iterator[str]:
    for match in _CALLED.finditer(line):
        for name in match.group(1).split(","):
            yield name.strip().lstrip("%")


def collectives(hlo_text: str) -> dict[str, Group]:
    """{loop body name or 'outside': Group} for the collectives reachable from the entry computation."""
    comps, entry = computations(hlo_text)
    groups: dict[str, Group] = {}

    def walk(name: str, group: str, seen: set[str]) -> None:
        if name in seen or name not in comps:
            return
        seen.add(name)
        for line in comps[name]:
            instruction = _INSTRUCTION.match(line)
            op = instruction.group(2) if instruction else ""
            if op == "while":
                body = re.search(r"\bbody=%?([\w.\-]+)", line).group(1)
                trips = _TRIPS.search(line)
                groups.setdefault(body, Group(trips=int(trips.group(1)) if trips else 1))
                walk(body, body, seen)
                continue
            kind = op.removesuffix("-start")
            if kind in KINDS and not op.endswith("-done"):
                groups.setdefault(group, Group()).counts[kind] += 1
                groups[group].bytes[kind] += result_bytes(instruction.group(1))
            for called in _called(line):
                walk(called, group, seen)

    walk(entry, "outside", set())
    return groups
