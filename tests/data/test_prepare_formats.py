"""prepare's input formats: jsonl compressed (gzip, Zstandard) and Parquet, directories and globs of
any mix; the same prepared files as plain jsonl; bad files refused with one line, --out untouched."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from t5x_lite.data.preparation import corpus as corpus_lib
from t5x_lite.data.preparation import formats
from t5x_lite.data.preparation import prepare as prep
from t5x_lite.data.records import example_codec, record_frame

WORDS = ["".join(random.Random(i).choices("abcdefghijklmnopqrstuvwxyz", k=2 + i % 8)) for i in range(300)]


def make_documents(count: int = 120) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choices(WORDS, k=rng.randint(5, 60))) + ("\n\tindented\r\n" if i % 7 == 0 else "\n")
            for i in range(count)]


def jsonl_lines(documents: list[str], field: str = "text") -> str:
    lines = [json.dumps({field: text, "n": i}) for i, text in enumerate(documents)]
    lines.insert(9, "")  # a blank line: skipped, still counted in the keys' line numbers
    lines.insert(20, json.dumps({field: "   "}))  # whitespace only: skipped
    return "\n".join(lines) + "\n"


def write_zst(path: Path, data: bytes) -> None:
    """Two frames, as concatenated .zst files or parallel compressors write them."""
    compressor = zstandard.ZstdCompressor()
    path.write_bytes(compressor.compress(data[:700]) + compressor.compress(data[700:]))


def write_parquet(path: Path, documents: list[str], **columns) -> None:
    texts = [*documents[:9], None, *documents[9:19], "   ", *documents[19:]]  # null and blank rows: skipped
    pq.write_table(pa.table({"n": list(range(len(texts))), "body": texts, **columns}), path, row_group_size=16)


def prepared_files(out_dir: Path) -> dict[str, bytes]:
    """Every file of a prepared directory but metadata.json (which names the inputs)."""
    return {p.name: p.read_bytes() for p in sorted(out_dir.iterdir()) if p.name != "metadata.json"}


def tokens_by_id(out_dir: Path) -> dict[int, list[int]]:
    """Each document's token ids, by document id, over both splits' shards."""
    records = []
    for shard in sorted(out_dir.glob("*-of-*.tfrecord")):
        with open(shard, "rb") as f:
            offset = 0
            while (frame := record_frame.read_frame(f, offset)) is not None:
                assert frame.damage is None
                records.append(frame.data)
                offset = frame.end
    ids = [int(values[0]) for values in example_codec.int64_feature(records, "id")]
    return dict(zip(ids, (values.tolist() for values in example_codec.int64_feature(records, "targets"))))


def run_prepare(inputs, out_dir, **kwargs) -> dict:
    options = dict(vocab_size=300, num_shards=2, validation_fraction=0.2, num_workers=2, log=lambda _: None)
    return prep.prepare(inputs=[str(i) for i in inputs], out_dir=str(out_dir), **{**options, **kwargs})


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> tuple[Path, list[str]]:
    """The same documents as <root>/{plain,gz,zst,parquet}/corpus/a.{jsonl,jsonl.gz,jsonl.zst,parquet}."""
    root = tmp_path_factory.mktemp("formats")
    documents = make_documents()
    text = jsonl_lines(documents)
    for name in ("plain", "gz", "zst", "parquet"):
        (root / name / "corpus").mkdir(parents=True)
    (root / "plain" / "corpus" / "a.jsonl").write_text(text)
    (root / "gz" / "corpus" / "a.jsonl.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    write_zst(root / "zst" / "corpus" / "a.jsonl.zst", text.encode())
    write_parquet(root / "parquet" / "corpus" / "a.parquet", documents)
    return root, documents


@pytest.fixture(scope="module")
def prepared_plain(corpora, tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("prepared") / "plain"
    run_prepare([corpora[0] / "plain" / "corpus"], out_dir)
    return out_dir


@pytest.mark.parametrize("name", ["gz", "zst"])
def test_compressed_jsonl_gives_the_same_files_as_plain_jsonl(corpora, prepared_plain, tmp_path, name):
    run_prepare([corpora[0] / name / "corpus"], tmp_path / "out")
    assert prepared_files(tmp_path / "out") == prepared_files(prepared_plain)
    metadata, plain = (json.loads((d / "metadata.json").read_text()) for d in (tmp_path / "out", prepared_plain))
    assert metadata.pop("sources") != plain.pop("sources")  # names the input given
    assert metadata == plain


def test_parquet_column_gives_the_same_tokens_as_jsonl(corpora, prepared_plain, tmp_path):
    run_prepare([corpora[0] / "parquet" / "corpus"], tmp_path / "out", text_column="body",
                vocab_model=str(prepared_plain / "spm.model"))
    expected = tokens_by_id(prepared_plain)
    assert len(expected) == len(corpora[1])
    assert tokens_by_id(tmp_path / "out") == expected


def test_directories_and_globs_of_any_mix(corpora, tmp_path):
    root, documents = corpora
    (tmp_path / "mix" / "sub").mkdir(parents=True)
    shutil.copy(root / "zst" / "corpus" / "a.jsonl.zst", tmp_path / "mix" / "sub" / "b.jsonl.zst")
    (tmp_path / "mix" / "c.txt").write_text("a whole file\n")
    sources = corpus_lib.resolve_inputs([str(root / "parquet" / "*" / "*.parquet"), str(tmp_path / "mix"),
                                         str(tmp_path / "mix" / "**" / "*.zst")])  # b.jsonl.zst reached twice: once
    assert [s.key for s in sources] == ["parquet/corpus/a.parquet", "mix/c.txt", "mix/sub/b.jsonl.zst"]
    found = list(corpus_lib.iter_documents(sources, text_column="body"))
    assert [d.text for d in found] == [*documents, "a whole file\n", *documents]
    assert [d.key for d in found][8:10] == ["parquet/corpus/a.parquet:9", "parquet/corpus/a.parquet:11"]
    assert found[-1].key == f"mix/sub/b.jsonl:{len(documents) + 2}"  # named as uncompressed, blank lines counted
    with pytest.raises(formats.PrepareError, match=r"--input='.*\*\.parquet' matches no file"):
        corpus_lib.resolve_inputs([str(tmp_path / "*.parquet")])


def test_parquet_is_read_in_batches_of_one_column(tmp_path, monkeypatch):
    path = tmp_path / "big.parquet"
    texts = [f"document {i} " + "x" * 1000 for i in range(2000)]  # about 2 MB in one column, 20 row groups
    pq.write_table(pa.table({"text": texts, "other": ["y" * 4000] * len(texts)}), path, row_group_size=100)
    monkeypatch.setattr(formats, "BATCH_BYTES", 64 << 10)
    peak, documents = 0, []
    reader = formats.reader_for(str(path)).documents(str(path), "big.parquet", formats.ReadOptions())
    for _, text in reader:
        documents.append(text)
        peak = max(peak, pa.total_allocated_bytes())
    assert documents == texts
    assert peak < 1 << 20  # 2 MB of text beside 8 MB of other strings; a batch is 64 KB (16 MB: 2.2 MB held)


@pytest.mark.parametrize("name, column_or_damage, message", [
    ("a.parquet", "missing", r"a\.parquet has no column 'missing' \(columns: \['n', 'body'.*--text_column"),
    ("a.parquet", "n", r"a\.parquet's column 'n' holds int64, not strings .*--text_column"),
    ("a.parquet", "truncated", r"a\.parquet cannot be read \(parquet: .*\); fix it or leave it out of --input"),
    ("a.jsonl.gz", "truncated", r"a\.jsonl\.gz cannot be read \(gzip: .*\); fix it or leave it out"),
    ("a.jsonl.gz", "corrupt", r"a\.jsonl\.gz cannot be read \(gzip: .*\); fix it or leave it out"),
    ("a.jsonl.zst", "truncated", r"a\.jsonl\.zst cannot be read \(zstandard: .*truncated\); fix it or leave"),
    ("a.jsonl.zst", "corrupt", r"a\.jsonl\.zst cannot be read \(zstandard: .*\); fix it or leave it out"),
])
def test_bad_files_are_refused_with_one_line_and_out_untouched(corpora, prepared_plain, tmp_path, name,
                                                               column_or_damage, message):
    source = {".parquet": corpora[0] / "parquet", ".gz": corpora[0] / "gz", ".zst": corpora[0] / "zst"}
    path = tmp_path / "in" / name
    path.parent.mkdir()
    if name.endswith(".parquet"):
        shutil.copy(source[".parquet"] / "corpus" / name, path)
    else:  # over 1 MB decompressed, so that damage near the end is met while reading, after the first MB
        text = jsonl_lines(make_documents(10_000)).encode()
        assert len(text) > 2 * corpus_lib.SNIFF_BYTES
        path.write_bytes(gzip.compress(text, mtime=0) if name.endswith(".gz") else
                         zstandard.ZstdCompressor().compress(text))
    data = path.read_bytes()
    if column_or_damage == "truncated":
        path.write_bytes(data[:len(data) - 100])
    elif column_or_damage == "corrupt":
        at = len(data) * 3 // 4  # past the first MB decompressed
        path.write_bytes(data[:at] + bytes(b ^ 0x5A for b in data[at:at + 200]) + data[at + 200:])
    out_dir = tmp_path / "out"
    shutil.copytree(prepared_plain, out_dir)
    before = tree_digest(out_dir)
    column = column_or_damage if column_or_damage in ("missing", "n") else "body"

    with pytest.raises(formats.InputFileError, match=message) as raised:
        run_prepare([path], out_dir, text_column=column, overwrite=True)
    assert "\n" not in str(raised.value) and str(path) in str(raised.value)
    assert tree_digest(out_dir) == before


def test_cli_refuses_a_parquet_file_without_the_column(corpora, tmp_path):
    from tests.cli.test_bad_input import assert_bad_input
    from tests.cli_helpers import run_cli

    result = run_cli("prepare", f"--input={corpora[0] / 'parquet' / 'corpus'}", f"--out={tmp_path / 'out'}",
                     "--vocab_size=300")  # the column is `body`, not the default `text`
    assert_bad_input(result, "a.parquet has no column 'text'", "--text_column")
    assert not (tmp_path / "out").exists()
