"""A Hugging Face model folder's safetensors files, read and written one tensor at a time.

Reading goes through the `safetensors` library's numpy interface (memory-mapped; PyTorch is not
needed, bfloat16 comes back as ml_dtypes.bfloat16). Writing streams: the header of each file is
computed from the tensors' shapes before any data is produced, so only the tensor being written
is in memory. A folder holds either `model.safetensors` or shards listed by
`model.safetensors.index.json` ({"metadata": {"total_size": ...}, "weight_map": {name: file}}).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import struct
from typing import Iterable, Iterator

import ml_dtypes
import numpy as np

from t5x_lite.hf.errors import ConversionError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# safetensors' dtype names.
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class TensorFiles:
    """The tensors of a local model folder, opened lazily; `read` loads one tensor."""

    def __init__(self, folder: str):
        from safetensors import safe_open  # only convert needs it

        self.folder = folder
        index_path = os.path.join(folder, INDEX_FILE)
        if os.path.exists(index_path):
            with open(index_path) as f:
                weight_map = json.load(f).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ConversionError(f"{index_path} has no 'weight_map' (tensor name -> file).")
            files = sorted(set(weight_map.values()))
        elif os.path.exists(os.path.join(folder, SINGLE_FILE)):
            files = [SINGLE_FILE]
        else:
            present = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
            hint = (" PyTorch .bin weights are not read: load the model in transformers and re-save it with "
                    "save_pretrained (which writes safetensors)." if any(p.endswith(".bin") for p in present) else "")
            raise ConversionError(f"{folder} holds no {SINGLE_FILE} and no {INDEX_FILE} (files: {present[:10]}).{hint}")
        self._stack = contextlib.ExitStack()
        self._handles = {}
        self._file_of: dict[str, str] = {}
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.exists(path):
                raise ConversionError(f"{INDEX_FILE} lists {name}, which is not in {folder}.")
            handle = self._stack.enter_context(safe_open(path, framework="np"))
            self._handles[name] = handle
            for key in handle.keys():
                self._file_of[key] = name

    def names(self) -> list[str]:
        return sorted(self._file_of)

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self._file_of[name]].get_slice(name).get_shape())

    def dtype_name(self, name: str) -> str:
        return self._handles[self._file_of[name]].get_slice(name).get_dtype()

    def read(self, name: str) -> np.ndarray:
        return self._handles[self._file_of[name]].get_tensor(name)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> "TensorFiles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A tensor to be written: its name, shape and numpy dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def plan_shards(specs: list[TensorSpec], max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Consecutive tensors grouped into files of at most `max_shard_bytes` (a bigger tensor gets its own)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return [s for s in shards if s]


def shard_file_names(num_shards: int) -> list[str]:
    if num_shards == 1:
        return [SINGLE_FILE]
    return [f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors" for i in range(num_shards)]


def _header(specs: list[TensorSpec], metadata: dict[str, str]) -> bytes:
    entries: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for spec in specs:
        entries[spec.name] = {"dtype": DTYPE_NAMES[spec.dtype], "shape": list(spec.shape),
                              "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # data starts 8-byte aligned, as the library writes it
    return struct.pack("<Q", len(text)) + text


def write(folder: str, specs: list[TensorSpec], tensors: Iterable[tuple[str, np.ndarray]], *,
          max_shard_bytes: int, metadata: dict[str, str] | None = None) -> list[str]:
    """Writes `tensors` (yielded in `specs`' order, each matching its spec) into `folder`; returns the files.

    More than one file also writes the index. Each tensor is written as soon as it is yielded.
    """
    metadata = {"format": "pt", **(metadata or {})}
    shards = plan_shards(specs, max_shard_bytes)
    files = shard_file_names(len(shards))
    stream: Iterator[tuple[str, np.ndarray]] = iter(tensors)
    for file_name, shard in zip(files, shards):
        with open(os.path.join(folder, file_name), "wb") as f:
            f.write(_header(shard, metadata))
            for spec in shard:
                name, array = next(stream)
                array = np.ascontiguousarray(array)
                if name != spec.name or tuple(array.shape) != spec.shape or array.dtype != spec.dtype:
                    raise AssertionError(f"expected {spec}, got {name} {array.shape} {array.dtype}")
                f.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
    if next(stream, None) is not None:
        raise AssertionError("more tensors than specs")
    if len(files) > 1:
        index = {"metadata": {"total_size": sum(s.nbytes for s in specs)},
                 "weight_map": {spec.name: file for file, shard in zip(files, shards) for spec in shard}}
        with open(os.path.join(folder, INDEX_FILE), "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
    return files
