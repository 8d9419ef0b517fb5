"""The documents of `prepare`'s inputs: which files, their texts, each one's split, the vocabulary's sample.

Inputs are files, directories (walked in sorted order), glob patterns (`shards/*.parquet`,
`dump/**/*.jsonl.zst`) or the word `python_stdlib`; each file is read by the reader of its format
(formats.py: whole text files, one document per jsonl line, plain or gzip or Zstandard, or per
Parquet row), with its text kept exactly. A document's split and its place in the vocabulary's
sample come from a stable hash of its key (its path relative to its input), so they are the same on
every machine, in every run, in any order. Binary files (`binary_reason` of the first SNIFF_BYTES
of what a file holds: NUL bytes, or more than 1% of bytes not UTF-8) are skipped, named in one
warning; inputs that are all binary are refused.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob as globbing
import hashlib
import heapq
import itertools
import os
import re
import sysconfig
from collections.abc import Callable, Iterable, Iterator, Sequence

from t5x_lite.data.preparation import formats
from t5x_lite.data.preparation.formats import PrepareError  # raised here; prepare's error, defined with the readers

PYTHON_STDLIB = "python_stdlib"
SPLITS = ("train", "validation")
_STDLIB_EXCLUDED_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
SNIFF_BYTES = 1 << 20  # the start of each file that is checked for binary content
MAX_UNDECODABLE_SHARE = 0.01  # more bytes than this share that are not UTF-8: a binary file
_UNDECODABLE = re.compile("[\udc80-\udcff]")  # surrogateescape's stand-in for each byte that is not UTF-8
_NAMED_SKIPPED = 3  # binary files named in a message; the rest are counted


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

    `glob` filters the file names found in directories (files named directly or by a pattern are
    always kept); names starting with "." are skipped in directories. An input that is no file or
    directory but holds `*`, `?` or `[` is a pattern (`**` crosses directories): its matches, sorted,
    keyed like the files of the folder the pattern starts in (its part before the first wildcard). The
    input `python_stdlib` stands for `python_stdlib_files()`. A file reached twice is kept once.
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
    if globbing.has_magic(name):
        return _glob(name, glob)
    raise PrepareError(
        f"Input {name!r} does not exist. Pass an existing file or directory to --input "
        f"(or the word {PYTHON_STDLIB} for this Python's standard library)."
    )


def _glob(pattern: str, glob: str | None) -> list[Source]:
    """The files `pattern` matches (directories it matches are walked), keyed from its fixed start."""
    matches = sorted(globbing.glob(pattern, recursive=True))
    if not matches:
        raise PrepareError(f"--input={pattern!r} matches no file. Check the pattern (quote it, so that "
                           "the shell leaves it to prepare; `**` matches any folders).")
    parts = pattern.replace(os.sep, "/").split("/")
    fixed = ("/".join(itertools.takewhile(lambda part: not globbing.has_magic(part), parts[:-1]))
             or ("/" if pattern.startswith("/") else ""))
    prefix = os.path.basename(os.path.normpath(fixed)) if fixed else ""
    sources = []
    for path in matches:
        relative = os.path.relpath(path, fixed or ".").replace(os.sep, "/")
        key = f"{prefix}/{relative}" if prefix else relative
        if os.path.isdir(path):
            sources.extend(_walk(path, glob, prefix=key))
        elif os.path.isfile(path):
            sources.append(Source(path, key))
    return sources


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


def _named(skipped: Sequence[tuple[Source, str]]) -> str:
    """'a.so (NUL bytes), b.gz (40% of bytes not UTF-8), c.bin (NUL bytes) and 5 more'."""
    named = ", ".join(f"{source.path} ({reason})" for source, reason in skipped[:_NAMED_SKIPPED])
    return named + (f" and {len(skipped) - _NAMED_SKIPPED} more" if len(skipped) > _NAMED_SKIPPED else "")


def text_sources(sources: Sequence[Source], log: Callable[[str], None] = print, *,
                 options: formats.ReadOptions = formats.ReadOptions()) -> list[Source]:
    """The sources that hold text (`binary_reason` of the first SNIFF_BYTES of what each holds: its
    bytes, decompressed for a compressed jsonl, its column's text for Parquet); the binary ones are
    skipped with one warning naming them, and a PrepareError when nothing is left. A file its
    reader cannot open (corrupt, wrong column) raises its InputFileError here, before any output."""
    kept, skipped = [], []
    for source in sources:
        reason = binary_reason(formats.reader_for(source.path).head(source.path, SNIFF_BYTES, options))
        if reason is None:
            kept.append(source)
        else:
            skipped.append((source, reason))
    if skipped and not kept:
        raise PrepareError(
            f"Every input file is binary, not text: {_named(skipped)}. prepare reads UTF-8 text files and "
            f"{formats.format_names()}; pass those to --input, or select them in a directory with --glob (e.g. --glob='*.txt').")
    if skipped:
        log(f"warning: skipped {len(skipped)} binary file{'s' if len(skipped) > 1 else ''} of {len(sources)} "
            f"(NUL bytes, or over {MAX_UNDECODABLE_SHARE:.0%} of bytes not UTF-8): {_named(skipped)}; "
            "--glob selects the text files of a directory.")
    return kept


def iter_documents(sources: Iterable[Source], jsonl_field: str = "text",
                   text_column: str = "text") -> Iterator[Document]:
    """The non-empty (not whitespace-only) documents of `sources`, numbered from 0 in order, each
    file read by its format's reader (`formats.reader_for`)."""
    options = formats.ReadOptions(jsonl_field=jsonl_field, text_column=text_column)
    next_id = 0
    for source in sources:
        for key, text in formats.reader_for(source.path).documents(source.path, source.key, options):
            if text.strip():
                yield Document(next_id, key, text)
                next_id += 1


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
