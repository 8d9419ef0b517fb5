"""Checksums of a checkpoint's files, written when a step is committed and checked before it is read.

Orbax stores no checksums, so a flipped byte in an array file restores silently as a wrong
number. When a save is committed, `write` lists every file of the step with its size and
CRC32C (google-crc32c) in `<step>/manifest.json`; `check` reads the files back and names the
first one whose size or checksum differs, or that is missing. The manifest is written last,
through a temporary name, so a step with a manifest is a step whose save finished.

The state of a step, as every reader and `t5x-lite checkpoint verify` report it:

    good         the manifest matches every file
    damaged      a file is missing, shorter or longer, or its bytes changed
    incomplete   Orbax committed the step but its manifest was never written (the run stopped
                 in between, or a live trainer is writing it now: `manifest_due`); a step with
                 neither a manifest nor the Orbax metadata a reader starts from (READER_METADATA:
                 a copy or save that was interrupted); or an interrupted save's temporary directory
    in progress  a temporary directory that a live run is writing
    unverified   saved before manifests existed (restored without a check)
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os

from t5x_lite import storage

MANIFEST = "manifest.json"
VERSION = 1
_CHUNK = 8 << 20

GOOD, DAMAGED, INCOMPLETE, IN_PROGRESS, UNVERIFIED = "good", "damaged", "incomplete", "in progress", "unverified"
READABLE = (GOOD, UNVERIFIED)  # the states a reader may restore
# The files a reader opens first (the model's metadata, the arrays' tree): a step without a manifest
# is unverified only when both are there, and incomplete when one is missing.
READER_METADATA = ("metadata/metadata", "state/_METADATA")


@dataclasses.dataclass(frozen=True)
class StepState:
    """What `check` found for one step directory: its state and, unless good, why."""

    step: int
    state: str
    reason: str = ""
    temporary: bool = False  # an Orbax temporary directory rather than a committed step
    # Incomplete only because its manifest is not there yet: Orbax committed it and its metadata
    # promises one, which a live trainer writes moments later (eval's watch mode looks again).
    manifest_due: bool = False

    @property
    def readable(self) -> bool:
        return self.state in READABLE

    def describe(self) -> str:
        return f"step {self.step}: {self.state}" + (f" ({self.reason})" if self.reason else "")


def crc32c_of(path: str) -> tuple[int, str]:
    """(size, CRC32C as 8 hex digits) of a file, read in chunks."""
    import google_crc32c  # a C extension; loaded only where checksums are taken

    checksum, size = google_crc32c.Checksum(), 0
    with (open(path, "rb") if not storage.is_url(path) else storage.open(path, "rb")) as f:
        while chunk := f.read(_CHUNK):
            checksum.update(chunk)
            size += len(chunk)
    return size, checksum.hexdigest().decode()


def _step_files(step_dir: str) -> list[str]:
    """The step's files relative to it, '/'-separated, sorted; the manifest itself excluded."""
    prefix = step_dir.rstrip("/") + "/"
    files = [path[len(prefix):] for path in storage.walk_files(step_dir)]
    if not storage.is_url(step_dir):
        files = [f.replace(os.sep, "/") for f in files]
    return sorted(f for f in files if f != MANIFEST and not f.startswith(f"{MANIFEST}."))


_PIECE = 32 << 20  # large local files are checksummed in pieces of this size, on several threads
_CASTAGNOLI = 0x82F63B78  # CRC-32C's polynomial, bit-reflected


def _times(matrix: tuple[int, ...], vector: int) -> int:
    """A 32x32 matrix over GF(2) (one int per column) times a 32-bit vector."""
    total, column = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[column]
        vector >>= 1
        column += 1
    return total


@functools.cache
def _zeros_operator(nbytes: int) -> tuple[int, ...]:
    """The matrix that advances a CRC-32C register over `nbytes` zero bytes (zlib's crc32_combine
    method: the one-bit operator squared three times is one byte; then square-and-multiply)."""
    operator = (_CASTAGNOLI, *(1 << n for n in range(31)))  # one zero bit
    for _ in range(3):
        operator = tuple(_times(operator, column) for column in operator)
    result = tuple(1 << n for n in range(32))  # identity
    while nbytes:
        if nbytes & 1:
            result = tuple(_times(operator, column) for column in result)
        operator = tuple(_times(operator, column) for column in operator)
        nbytes >>= 1
    return result


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """The CRC-32C of A followed by B from the CRC-32Cs of A and B and B's length (pure)."""
    return _times(_zeros_operator(length_b), crc_a) ^ crc_b


def _piece_crc(piece: tuple[str, int, int]) -> int:
    """The CRC-32C of `length` bytes of a local file from `offset`."""
    import google_crc32c

    path, offset, length = piece
    checksum = google_crc32c.Checksum()
    with open(path, "rb") as f:
        f.seek(offset)
        while length > 0:
            chunk = f.read(min(_CHUNK, length))
            if not chunk:
                break
            checksum.update(chunk)
            length -= len(chunk)
    return int.from_bytes(checksum.digest(), "big")


def _local_crc32c(path: str, pool: concurrent.futures.Executor) -> tuple[int, str]:
    """(size, CRC32C) of a local file: its pieces on the pool, combined. The odd-sized piece comes
    first, so that every combine advances over _PIECE bytes (one cached operator)."""
    size = os.path.getsize(path)
    head = size % _PIECE
    pieces = ([(path, 0, head)] if head or not size else []) + [
        (path, offset, _PIECE) for offset in range(head, size, _PIECE)]
    crcs = list(pool.map(_piece_crc, pieces))
    crc = crcs[0]
    for later in crcs[1:]:
        crc = crc32c_combine(crc, later, _PIECE)
    return size, f"{crc:08x}"


def _checksums(step_dir: str, relatives: list[str]) -> dict[str, tuple[int, str]]:
    """{relative path: (size, CRC32C)}, read in parallel: google-crc32c and file reads release the
    GIL, so a step is checksummed at several cores' speed (a large local file in pieces)."""
    paths = [storage.join(step_dir, *relative.split("/")) for relative in relatives]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        if storage.is_url(step_dir):
            return dict(zip(relatives, pool.map(crc32c_of, paths)))
        # Files one after the other, each one's pieces in parallel (a pool task never waits on the pool).
        return {relative: _local_crc32c(path, pool) for relative, path in zip(relatives, paths)}


def write(step_dir: str, *, step: int) -> dict:
    """Writes `<step_dir>/manifest.json` of every file under it; returns the manifest."""
    files = {relative: {"size": size, "crc32c": crc}
             for relative, (size, crc) in _checksums(step_dir, _step_files(step_dir)).items()}
    manifest = {"version": VERSION, "step": step, "files": files}
    storage.write_whole(storage.join(step_dir, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def has_manifest(step_dir: str) -> bool:
    return storage.exists(storage.join(step_dir, MANIFEST))


def check(step_dir: str, *, step: int, sizes_only: bool = False) -> StepState:
    """The state of a committed step directory (see the module docstring); every reader, `train`
    and `checkpoint verify` judge a step by it.

    `sizes_only`: compare each file's size and not its bytes (a quick look at a large directory;
    `good` then means no file is missing, cut short or grown).
    """
    manifest_path = storage.join(step_dir, MANIFEST)
    if not storage.exists(manifest_path):
        return _without_manifest(step_dir, step)
    try:
        with storage.open(manifest_path, "r") as f:
            files = json.load(f)["files"]
    except (ValueError, KeyError, TypeError) as e:
        return StepState(step, DAMAGED, f"{MANIFEST} is unreadable: {e}")
    present = set(_step_files(step_dir))
    missing = sorted(set(files) - present)
    if missing:
        return StepState(step, DAMAGED, f"{missing[0]} is missing")
    if sizes_only:
        found = {relative: (_size(storage.join(step_dir, *relative.split("/"))), files[relative]["crc32c"])
                 for relative in files}
    else:
        found = _checksums(step_dir, sorted(files))
    for relative, expected in sorted(files.items()):
        size, crc = found[relative]
        if size != expected["size"]:
            return StepState(step, DAMAGED, f"{relative} has {size} bytes, {expected['size']} when saved")
        if crc != expected["crc32c"]:
            return StepState(step, DAMAGED, f"{relative}: CRC32C {crc}, {expected['crc32c']} when saved "
                                            "(its bytes changed after the save)")
    extra = sorted(present - set(files))
    if extra:
        return StepState(step, DAMAGED, f"{extra[0]} was not part of the save" + (
            f" (and {len(extra) - 1} more files)" if len(extra) > 1 else ""))
    return StepState(step, GOOD)


def _size(path: str) -> int:
    if storage.is_url(path):
        with storage.open(path, "rb") as f:
            return f.seek(0, 2)
    return os.path.getsize(path)


def _without_manifest(step_dir: str, step: int) -> StepState:
    """A step without manifest.json: incomplete (its save or copy stopped), or unverified (saved
    before manifests existed, with the metadata a reader needs)."""
    missing = next((m for m in READER_METADATA if not storage.exists(storage.join(step_dir, *m.split("/")))), None)
    saved = None if missing else _metadata_item(step_dir)
    if saved is None:
        what = f"no {missing}" if missing else f"{READER_METADATA[0]} unreadable"
        return StepState(step, INCOMPLETE, f"no {MANIFEST} and {what}: a copy or save of the step was interrupted; "
                                           "copy it again, or remove it")
    if saved.get("manifest"):
        return StepState(step, INCOMPLETE, "committed by Orbax but no manifest.json: the run stopped before "
                                           "the save was finished", manifest_due=True)
    return StepState(step, UNVERIFIED, "saved without a manifest, so its bytes cannot be checked")


def _metadata_item(step_dir: str) -> dict | None:
    """The step's metadata item (model, task, metrics; whether a manifest was written), or None
    when it cannot be read."""
    try:
        with storage.open(storage.join(step_dir, "metadata", "metadata"), "r") as f:
            saved = json.load(f)
    except Exception:  # noqa: BLE001 - no readable metadata: the caller says so
        return None
    return saved if isinstance(saved, dict) else None
