"""`prepare`'s rule for binary input files (corpus.binary_reason), and the inputs it keeps."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from t5x_lite.data.preparation import corpus

ELF_HEADER = b"\x7fELF\x02\x01\x01\x00" + bytes(8) + b"\x03\x00\x3e\x00"  # the start of a .so


def _random_bytes(n: int, seed: int = 0, *, nul: bool = True) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.randrange(0 if nul else 1, 256) for _ in range(n))


def test_text_in_any_script_is_text():
    assert corpus.binary_reason(b"") is None
    assert corpus.binary_reason("def f(x):\n\treturn x  # café, 日本語, 🙂\r\n".encode()) is None


def test_a_nul_byte_makes_binary():
    assert corpus.binary_reason(b"plain text\0more text") == "NUL bytes"
    assert corpus.binary_reason(ELF_HEADER) == "NUL bytes"
    assert corpus.binary_reason("text".encode("utf-16")) == "NUL bytes"  # not UTF-8


def test_more_than_one_percent_of_bytes_not_utf8_makes_binary():
    assert corpus.binary_reason(b"a" * 990 + b"\xff" * 10) is None  # 1% exactly: still text
    assert corpus.binary_reason(b"a" * 990 + b"\xff" * 11) == "1% of bytes not UTF-8"
    assert corpus.binary_reason(gzip.compress(b"some text " * 1000, mtime=1)[10:]) is not None  # deflate data
    reason = corpus.binary_reason(_random_bytes(4096, nul=False))
    assert reason is not None and reason.endswith("% of bytes not UTF-8") and int(reason.split("%")[0]) > 30


def _inputs(root: Path, binaries: dict[str, bytes]) -> list[corpus.Source]:
    root.mkdir()
    (root / "a.py").write_text("def a():\n    return 1\n")
    (root / "notes.txt").write_text("plain notes, naïve café\n")
    with gzip.open(root / "docs.jsonl.gz", "wt") as f:  # text once decompressed: kept
        f.write(json.dumps({"text": "a document"}) + "\n")
    for name, data in binaries.items():
        (root / name).write_bytes(data)
    return corpus.resolve_inputs([str(root)])


def test_binary_files_are_skipped_and_named_in_one_warning(tmp_path):
    sources = _inputs(tmp_path / "in", {"lib.so": ELF_HEADER + _random_bytes(2000),
                                        "text.txt.gz": gzip.compress(b"compressed, not read as text " * 50)})
    logged = []
    kept = corpus.text_sources(sources, logged.append)
    assert [Path(s.path).name for s in kept] == ["a.py", "docs.jsonl.gz", "notes.txt"]
    (line,) = logged
    assert line.startswith("warning: skipped 2 binary files of 5 (NUL bytes, or over 1% of bytes not UTF-8): ")
    assert f"{tmp_path}/in/lib.so (NUL bytes)" in line and f"{tmp_path}/in/text.txt.gz (" in line
    assert "more" not in line


def test_many_binary_files_are_counted_after_the_first_three(tmp_path):
    sources = _inputs(tmp_path / "in", {f"blob{i}.bin": _random_bytes(100, seed=i) for i in range(5)})
    logged = []
    assert len(corpus.text_sources(sources, logged.append)) == 3
    assert logged[0].count("blob") == 3 and " and 2 more; --glob selects the text files" in logged[0]


def test_inputs_that_are_all_binary_are_refused(tmp_path):
    (tmp_path / "in").mkdir()
    for i in range(4):
        (tmp_path / "in" / f"blob{i}.bin").write_bytes(_random_bytes(100, seed=i))
    with pytest.raises(corpus.PrepareError, match=r"Every input file is binary, not text: .*blob0.bin \(NUL bytes\)"
                                                  r".* and 1 more\. prepare reads UTF-8 text.*--glob"):
        corpus.text_sources(corpus.resolve_inputs([str(tmp_path / "in")]), print)


def test_a_jsonl_gz_that_is_not_gzip_is_named(tmp_path):
    (tmp_path / "broken.jsonl.gz").write_text('{"text": "not compressed"}\n')
    with pytest.raises(corpus.PrepareError, match=r"broken.jsonl.gz cannot be read \(.*\); fix it or leave it out"):
        corpus.text_sources(corpus.resolve_inputs([str(tmp_path / "broken.jsonl.gz")]))
