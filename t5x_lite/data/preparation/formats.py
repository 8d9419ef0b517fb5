"""`prepare`'s input formats: one reader per format, chosen by the file's suffix (`reader_for`).

  .jsonl                one document per line, the text under --jsonl_field
  .jsonl.gz, .jsonl.zst the same, compressed (gzip; Zstandard, streamed frame by frame)
  .parquet              one document per row, the text in the string column --text_column, read
                        in batches of about BATCH_BYTES of that column alone
  any other file        one document: the whole file

Every reader streams: what it holds at once does not grow with the file (one line; one batch of one
column, its pages read through a small buffer). A compressed jsonl names its documents as the same
file uncompressed does (`docs.jsonl.zst:7` is `docs.jsonl:7`), so compressing a corpus changes
neither its split nor its prepared files. A file that cannot be decoded (corrupt or truncated
gzip, Zstandard or Parquet; a missing or non-string column) raises an `InputFileError` naming the
file and the fix. pyarrow and zstandard are imported only when a file of theirs is read.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import itertools
import json
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO, Protocol

from t5x_lite.errors import UserError

BATCH_BYTES = 16 << 20  # text of a Parquet column read at once (rows per batch from the file's metadata)
_ZSTD_CHUNK = 1 << 17  # compressed bytes read (and decompressed) at once from a .zst file
_ZSTD_MAX_WINDOW = 1 << 31  # the largest window `zstd --long=31` writes
_PARQUET_BUFFER = 1 << 20  # bytes of a column chunk read at once (its pages are decoded as they come)
_MAX_DETAIL = 200  # characters of a decoder's own message kept in an error


class PrepareError(UserError, ValueError):
    """The inputs or options of `prepare` cannot produce a dataset; the message names the fix."""


class InputFileError(PrepareError):
    """An input file that its format's reader cannot read (corrupt, truncated, wrong column)."""


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """Where the text is: the field of a jsonl record, the column of a Parquet file."""

    jsonl_field: str = "text"
    text_column: str = "text"


class Reader(Protocol):
    """How the files of one format become documents."""

    def head(self, path: str, max_bytes: int, options: ReadOptions) -> bytes:
        """About the first `max_bytes` of what the file holds, for the binary-file check."""

    def documents(self, path: str, key: str, options: ReadOptions) -> Iterator[tuple[str, str]]:
        """(document key, text) of each record in file order; `key` is the file's own key."""


def _unreadable(path: str, kind: str, error: BaseException) -> InputFileError:
    detail = " ".join(str(error).split())[:_MAX_DETAIL] or type(error).__name__
    return InputFileError(f"{path} cannot be read ({kind}: {detail}); fix it or leave it out of --input.")


def _missing(package: str, path: str) -> PrepareError:
    return PrepareError(f"Reading {path} needs the package {package}, which is not installed: "
                        f"pip install {package} (requirements/lock.txt pins its version).")


# ------------------------------------------------------------------------------ whole files


class TextReader:
    """Any other file: one document, its whole text (UTF-8; bytes that are not are replaced)."""

    def head(self, path: str, max_bytes: int, options: ReadOptions) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read(max_bytes)
        except OSError as e:
            raise _unreadable(path, "text", e) from None

    def documents(self, path: str, key: str, options: ReadOptions) -> Iterator[tuple[str, str]]:
        try:
            with open(path, encoding="utf-8", errors="replace", newline="") as f:
                text = f.read()
        except OSError as e:
            raise _unreadable(path, "text", e) from None
        yield key, text


# ------------------------------------------------------------------------------------ jsonl


class ZstdDataError(OSError):
    """A .zst file's bytes are not whole Zstandard frames."""


class _ZstdStream(io.RawIOBase):
    """The decompressed bytes of a .zst file, frame after frame; one that ends inside a frame raises
    ZstdDataError (zstandard's own stream reader would end quietly there), as does a corrupt one."""

    def __init__(self, path: str):
        try:
            import zstandard
        except ImportError:
            raise _missing("zstandard", path) from None
        self._zstd_error = zstandard.ZstdError
        self._raw = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._decompressor = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
        self._frame = self._decompressor.decompressobj()
        self._in_frame = False
        self._out = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not len(self._out):
            chunk = self._raw.read(_ZSTD_CHUNK)
            if not chunk:
                if self._in_frame:
                    raise ZstdDataError("the file ends inside a frame: it is truncated")
                return 0
            try:
                self._out = memoryview(self._decompress(chunk))
            except self._zstd_error as e:
                raise ZstdDataError(str(e)) from None
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _decompress(self, data: bytes) -> bytes:
        parts = []
        while data:
            parts.append(self._frame.decompress(data))
            self._in_frame = not self._frame.eof
            if self._in_frame:
                break
            data = self._frame.unused_data  # the next frame's start
            self._frame = self._decompressor.decompressobj()
        return b"".join(parts)

    def close(self) -> None:
        self._raw.close()
        super().close()


def _open_zstd(path: str) -> BinaryIO:
    return io.BufferedReader(_ZstdStream(path), buffer_size=1 << 20)  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True)
class JsonlReader:
    """One document per line (blank lines skipped, still counted) of a jsonl file that `open_binary`
    decompresses; `suffix` (".gz", ".zst" or "") is left out of the documents' keys."""

    open_binary: Callable[[str], BinaryIO]
    kind: str  # for messages: "jsonl", "gzip", "zstandard"
    errors: tuple[type[BaseException], ...]  # what a corrupt or truncated file raises
    suffix: str = ""

    def head(self, path: str, max_bytes: int, options: ReadOptions) -> bytes:
        try:
            with self.open_binary(path) as f:
                return f.read(max_bytes)
        except self.errors as e:
            raise _unreadable(path, self.kind, e) from None

    def documents(self, path: str, key: str, options: ReadOptions) -> Iterator[tuple[str, str]]:
        key = key.removesuffix(self.suffix)
        field = options.jsonl_field
        try:
            with io.TextIOWrapper(self.open_binary(path), encoding="utf-8", errors="replace") as f:
                for line_number, line in enumerate(f, start=1):
                    if line.strip():
                        try:
                            text = _text_of(line, field, f"{path}:{line_number}")
                        except PrepareError:
                            if self.suffix:  # damaged data decompresses to garbage: the checksum at the end says so
                                for _ in f:
                                    pass
                            raise
                        yield f"{key}:{line_number}", text
        except PrepareError:
            raise
        except self.errors as e:
            raise _unreadable(path, self.kind, e) from None


def _text_of(line: str, field: str, where: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise PrepareError(f"{where} is not valid JSON ({e}); fix or remove that line.") from None
    if not isinstance(record, dict) or not isinstance(record.get(field), str):
        fields = sorted(record) if isinstance(record, dict) else []
        raise PrepareError(f"{where} has no string field {field!r} (fields: {fields}). "
                           "Pass the name of the text field with --jsonl_field.")
    return record[field]


# ---------------------------------------------------------------------------------- parquet


class ParquetReader:
    """One document per row: the string column `text_column` alone, read in batches of about
    BATCH_BYTES (null rows are skipped, still counted; keys `file.parquet:ROW`, from 1)."""

    kind = "parquet"

    def head(self, path: str, max_bytes: int, options: ReadOptions) -> bytes:
        texts, size = [], 0
        for _, text in self.documents(path, "", options):
            texts.append(text.encode("utf-8", errors="replace"))
            size += len(texts[-1]) + 1
            if size >= max_bytes:
                break
        return b"\n".join(texts)[:max_bytes]

    def documents(self, path: str, key: str, options: ReadOptions) -> Iterator[tuple[str, str]]:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise _missing("pyarrow", path) from None
        column = options.text_column
        try:
            with pq.ParquetFile(path, pre_buffer=False, buffer_size=_PARQUET_BUFFER) as f:
                _check_column(path, f.schema_arrow, column)
                rows = itertools.count(1)
                for batch in f.iter_batches(batch_size=_batch_rows(f, column), columns=[column]):
                    for text, row in zip(batch.column(0).to_pylist(), rows):  # the batch first: no row lost
                        if text is not None:  # blank texts are left to the caller, as for jsonl
                            yield f"{key}:{row}", text
        except PrepareError:
            raise
        except (OSError, pa.ArrowException, ValueError) as e:  # ValueError: a string that is not UTF-8
            raise _unreadable(path, self.kind, e) from None


def _check_column(path: str, schema, column: str) -> None:
    import pyarrow as pa

    def is_text(t) -> bool:
        return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
                or (pa.types.is_dictionary(t) and is_text(t.value_type)))

    text_columns = [field.name for field in schema if is_text(field.type)]
    if schema.get_field_index(column) < 0:
        raise InputFileError(f"{path} has no column {column!r} (columns: {schema.names}; of strings: "
                             f"{text_columns}). Pass the name of the text column with --text_column.")
    if not is_text(schema.field(column).type):
        raise InputFileError(f"{path}'s column {column!r} holds {schema.field(column).type}, not strings "
                             f"(columns of strings: {text_columns}). Pass a column of text with --text_column.")


def _batch_rows(parquet_file, column: str) -> int:
    """Rows per batch for about BATCH_BYTES of `column`, from the row groups' sizes."""
    metadata = parquet_file.metadata
    leaves = [j for j in range(metadata.num_columns) if metadata.schema.column(j).path == column]
    if not leaves or not metadata.num_rows:
        return 1024
    size = sum(metadata.row_group(i).column(leaves[0]).total_uncompressed_size
               for i in range(metadata.num_row_groups))
    return max(1, min(65536, BATCH_BYTES * metadata.num_rows // max(size, 1)))


# --------------------------------------------------------------------------------- registry

TEXT = TextReader()
READERS: dict[str, Reader] = {
    ".jsonl": JsonlReader(lambda path: open(path, "rb"), "jsonl", (OSError,)),  # noqa: SIM115
    ".jsonl.gz": JsonlReader(lambda path: gzip.open(path, "rb"), "gzip", (OSError, EOFError, zlib.error), ".gz"),
    ".jsonl.zst": JsonlReader(_open_zstd, "zstandard", (OSError,), ".zst"),
    ".parquet": ParquetReader(),
}


def reader_for(path: str) -> Reader:
    """The reader of `path`'s format: the longest suffix of READERS it ends with, else TEXT."""
    suffixes = [suffix for suffix in READERS if path.endswith(suffix)]
    return READERS[max(suffixes, key=len)] if suffixes else TEXT


def format_names() -> str:
    """'.jsonl, .jsonl.gz, .jsonl.zst and .parquet': the formats other than plain text, for messages."""
    names = list(READERS)
    return ", ".join(names[:-1]) + f" and {names[-1]}"
