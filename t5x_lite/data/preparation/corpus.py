"""The documents of `prepare`'s inputs: which files, their texts, each one's split, the vocabulary's sample.

Inputs are files, directories (walked in sorted order) or the word `python_stdlib`; documents are
whole files, or one per line of `.jsonl`/`.jsonl.gz` files, with their text kept exactly. A
document's split and its place in the vocabulary's sample come from a stable hash of its key (its
path relative to its input), so they are the same on every machine, in every run, in any order.
Binary files (`binary_reason`: NUL bytes, or more than 1% of bytes not UTF-8) are skipped, named in one
warning; inputs that are all binary are refused.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import gzip
import hashlib
import heapq
import json
import os
import re
import sysconfig
from collections.abc import Callable, Iterable, Iterator, Sequence

from t5x_lite.errors import UserError

PYTHON_STDLIB = "python_stdlib"
SPLITS = ("train", "validation")
_STDLIB_EXCLUDED_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
SNIFF_BYTES = 1 << 20  # the start of each file that is checked for binary content
MAX_UNDECODABLE_SHARE = 0.01  # more bytes than this share that are not UTF-8: a binary file
_UNDECODABLE = re.compile("[\udc80-\udcff]")  # surrogateescape's stand-in for each byte that is not UTF-8
_NAMED_SKIPPED = 3  # binary files named in a message; the rest are counted


class PrepareError(UserError, ValueError):
    """The inputs or options of `prepare` cannot produce a dataset; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Source:
    """An input file and the stable key (path relative to its input) used to split it."""

    path: str
    key: str


@dataclasses.dataclass(frozen=True)
class Document:
    """One non-empty document: its index among all documents, its source key and its text."""

    id: int
    key: str
    text: str


# ------------------------------------------------------------------------------------ inputs


def python_stdlib_files() -> list[str]:
    """All `*.py` files of this interpreter's standard library, without tests and site-packages."""
    return [source.path for source in _stdlib_sources()]


def _stdlib_sources() -> list[Source]:
    return _walk(sysconfig.get_paths()["stdlib"], "*.py", prefix=PYTHON_STDLIB,
                 excluded_dirs=_STDLIB_EXCLUDED_DIRS)


def resolve_inputs(inputs: Sequence[str], glob: str | None = None) -> list[Source]:
    """The files named by `inputs`, in order; directories are walked recursively, sorted.

    `glob` filters the file names found in directories (files named directly are always kept);
    names starting with "." are skipped in directories. The input `python_stdlib` stands for
    `python_stdlib_files()`. A file reached twice is kept once.
    """
    sources, seen = [], set()
    for name in inputs:
        for source in _expand(name, glob):
            real = os.path.realpath(source.path)
            if real not in seen:
                seen.add(real)
                sources.append(source)
    if not sources:
        where = ", ".join(inputs)
        raise PrepareError(
            f"No input files found in {where}" + (f" matching --glob={glob!r}" if glob else "")
            + ": the directories are empty or the glob matched nothing. Check --input and --glob."
        )
    return sources


def _expand(name: str, glob: str | None) -> list[Source]:
    if name == PYTHON_STDLIB:
        return [s for s in _stdlib_sources() if _matches(os.path.basename(s.path), glob)]
    if os.path.isdir(name):
        return _walk(name, glob)
    if os.path.isfile(name):
        return [Source(name, os.path.basename(name))]
    raise PrepareError(
        f"Input {name!r} does not exist. Pass an existing file or directory to --input "
        f"(or the word {PYTHON_STDLIB} for this Python's standard library)."
    )


def _matches(filename: str, glob: str | None) -> bool:
    return not filename.startswith(".") and (glob is None or fnmatch.fnmatch(filename, glob))


def _walk(root: str, glob: str | None, *, prefix: str | None = None,
          excluded_dirs: Iterable[str] = ()) -> list[Source]:
    """Files under `root` in sorted order, keyed `<prefix>/<relative path>`.

    `prefix` defaults to the name of `root`, so keys do not depend on where the data lives.
    """
    prefix = prefix or os.path.basename(os.path.normpath(root))
    sources = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in excluded_dirs)
        for filename in filter(lambda name: _matches(name, glob), sorted(filenames)):
            path = os.path.join(dirpath, filename)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            sources.append(Source(path, f"{prefix}/{relative}"))
    return sources


def binary_reason(data: bytes) -> str | None:
    """Why `data` is not text, or None when it is: it holds a NUL byte, or more than
    MAX_UNDECODABLE_SHARE of its bytes are not UTF-8. The one rule by which `prepare` skips binary files."""
    if b"\0" in data:
        return "NUL bytes"
    undecodable = len(_UNDECODABLE.findall(data.decode("utf-8", errors="surrogateescape")))
    if undecodable > MAX_UNDECODABLE_SHARE * len(data):
        return f"{undecodable / len(data):.0%} of bytes not UTF-8"
    return None


def _head(source: Source) -> bytes:
    """The first SNIFF_BYTES of what a file holds (its decompressed text for `.jsonl.gz`)."""
    opener = gzip.open if source.path.endswith(".jsonl.gz") else open
    try:
        with opener(source.path, "rb") as f:
            return f.read(SNIFF_BYTES)
    except (OSError, EOFError) as e:  # unreadable, or a .jsonl.gz that is not gzip (gzip.BadGzipFile)
        raise PrepareError(f"{source.path} cannot be read ({e}); fix it or leave it out of --input.") from None


def _named(skipped: Sequence[tuple[Source, str]]) -> str:
    """'a.so (NUL bytes), b.gz (40% of bytes not UTF-8), c.bin (NUL bytes) and 5 more'."""
    named = ", ".join(f"{source.path} ({reason})" for source, reason in skipped[:_NAMED_SKIPPED])
    return named + (f" and {len(skipped) - _NAMED_SKIPPED} more" if len(skipped) > _NAMED_SKIPPED else "")


def text_sources(sources: Sequence[Source], log: Callable[[str], None] = print) -> list[Source]:
    """The sources that hold text (`binary_reason` of each one's first SNIFF_BYTES); the binary
    ones are skipped with one warning naming them, and a PrepareError when nothing is left."""
    kept, skipped = [], []
    for source in sources:
        reason = binary_reason(_head(source))
        if reason is None:
            kept.append(source)
        else:
            skipped.append((source, reason))
    if skipped and not kept:
        raise PrepareError(
            f"Every input file is binary, not text: {_named(skipped)}. prepare reads UTF-8 text files and "
            ".jsonl/.jsonl.gz; pass those to --input, or select them in a directory with --glob (e.g. --glob='*.txt').")
    if skipped:
        log(f"warning: skipped {len(skipped)} binary file{'s' if len(skipped) > 1 else ''} of {len(sources)} "
            f"(NUL bytes, or over {MAX_UNDECODABLE_SHARE:.0%} of bytes not UTF-8): {_named(skipped)}; "
            "--glob selects the text files of a directory.")
    return kept


def iter_documents(sources: Iterable[Source], jsonl_field: str = "text") -> Iterator[Document]:
    """The non-empty (not whitespace-only) documents of `sources`, numbered from 0 in order."""
    next_id = 0
    for source in sources:
        for key, text in _read_source(source, jsonl_field):
            if text.strip():
                yield Document(next_id, key, text)
                next_id += 1


def _read_source(source: Source, jsonl_field: str) -> Iterator[tuple[str, str]]:
    if source.path.endswith((".jsonl", ".jsonl.gz")):
        yield from _read_jsonl(source, jsonl_field)
    else:
        with open(source.path, encoding="utf-8", errors="replace", newline="") as f:
            yield source.key, f.read()


def _read_jsonl(source: Source, field: str) -> Iterator[tuple[str, str]]:
    opener = gzip.open if source.path.endswith(".gz") else open
    with opener(source.path, "rt", encoding="utf-8", errors="replace") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{source.path}:{line_number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise PrepareError(f"{where} is not valid JSON ({e}); fix or remove that line.")
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                fields = sorted(record) if isinstance(record, dict) else []
                raise PrepareError(
                    f"{where} has no string field {field!r} (fields: {fields}). "
                    "Pass the name of the text field with --jsonl_field."
                )
            yield f"{source.key}:{line_number}", record[field]


# ------------------------------------------------------------------------ split and sample


def _unit_hash(*parts: object) -> float:
    """A stable pseudo-random number in [0, 1) from `parts` (same on every machine and run)."""
    digest = hashlib.sha256("\0".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(key: str, *, seed: int, validation_fraction: float) -> str:
    """"validation" for a `validation_fraction` of document keys, else "train"."""
    return "validation" if _unit_hash(seed, "split", key) < validation_fraction else "train"


class VocabSample:
    """A uniform, deterministic sample of about `max_bytes` of text, drawn in one pass.

    Keeps the documents of lowest hash priority whose sizes add up to at least `max_bytes`, so
    the result depends only on the documents and the seed, not on the order they arrive in.
    """

    def __init__(self, max_bytes: int, seed: int):
        self._max_bytes = max_bytes
        self._seed = seed
        self._heap: list[tuple[float, int, int, str]] = []  # (-priority, id, bytes, text)
        self._bytes = 0

    def offer(self, document: Document, num_bytes: int) -> None:
        priority = _unit_hash(self._seed, "vocab", document.key)
        heapq.heappush(self._heap, (-priority, document.id, num_bytes, document.text))
        self._bytes += num_bytes
        while self._bytes - self._heap[0][2] >= self._max_bytes:
            self._bytes -= heapq.heappop(self._heap)[2]

    @property
    def num_bytes(self) -> int:
        return self._bytes

    def texts(self) -> list[str]:
        """The sampled texts in document order."""
        return [text for _, _, _, text in sorted(self._heap, key=lambda item: item[1])]


@dataclasses.dataclass
class Survey:
    """What one pass over the documents found: documents per split, input bytes, vocabulary sample."""

    num_documents: dict[str, int]
    input_bytes: int
    sample: VocabSample


def survey(documents: Iterable[Document], *, seed: int, validation_fraction: float,
           vocab_sample_bytes: int) -> Survey:
    """Counts documents per split and samples training text for the vocabulary, in one pass."""
    result = Survey(dict.fromkeys(SPLITS, 0), 0, VocabSample(vocab_sample_bytes, seed))
    for document in documents:
        num_bytes = len(document.text.encode())
        result.input_bytes += num_bytes
        split = split_of(document.key, seed=seed, validation_fraction=validation_fraction)
        result.num_documents[split] += 1
        if split == "train":
            result.sample.offer(document, num_bytes)
    return result
