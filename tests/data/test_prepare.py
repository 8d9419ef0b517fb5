"""prepare: text and jsonl → SentencePiece vocabulary + sharded TFRecords, on tiny corpora."""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import pytest
import sentencepiece as spm
import tensorflow as tf

from t5x_lite.data.preparation import corpus as corpus_lib
from t5x_lite.data.preparation import prepare as prep
from t5x_lite.data.preparation import spm_vocabulary

VOCAB_SIZE = 320
WORDS = ["alpha", "beta", "gamma", "delta", "value", "total", "count", "index", "item", "result"]


def _function_source(rng: random.Random, i: int) -> str:
    a, b, c = rng.sample(WORDS, 3)
    return (f"def {a}_{i}({b}, {c}):\n"
            f"    {a} = {b} + {c} * {rng.randint(0, 999)}\n"
            f"    if {a} > {rng.randint(0, 99)}:\n"
            f"        return {b}_{c}({a})\n"
            f"    return {a}\n\n")


def make_corpus(root: Path) -> dict[str, str]:
    """A few dozen small code and text files; returns the expected documents by relative path."""
    rng = random.Random(0)
    documents = {}
    for i in range(30):
        documents[f"pkg/mod_{i:02d}.py"] = "".join(_function_source(rng, i * 10 + j)
                                                   for j in range(rng.randint(1, 4)))
    for i in range(8):
        documents[f"notes/note_{i}.txt"] = " ".join(rng.choices(WORDS, k=40)) + "\n"
    documents["notes/long_line.txt"] = " ".join(rng.choices(WORDS, k=4000))  # > 16 KB, one line
    for relative, text in documents.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    (root / "pkg" / "empty.py").write_text("  \n")  # whitespace only: skipped
    (root / "pkg" / ".hidden.py").write_text("secret = 1\n")  # hidden: skipped
    return documents


def read_split(out_dir: Path, split: str) -> list[list[dict]]:
    """Each shard of `split` as a list of {"id", "targets"} records, in file order."""
    shards = []
    for path in sorted(out_dir.glob(f"{split}-*-of-*.tfrecord")):
        records = []
        for raw in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
            feature = tf.train.Example.FromString(raw).features.feature
            records.append({"id": feature["id"].int64_list.value[0],
                            "targets": list(feature["targets"].int64_list.value)})
        shards.append(records)
    return shards


def run_prepare(inputs, out_dir, **kwargs) -> dict:
    options = dict(vocab_size=VOCAB_SIZE, num_shards=3, validation_fraction=0.2, num_workers=2,
                   log=lambda _: None)
    return prep.prepare(inputs=[str(i) for i in inputs], out_dir=str(out_dir), **{**options, **kwargs})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("corpus") / "code"
    return root, make_corpus(root)


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory) -> tuple[Path, dict]:
    out_dir = tmp_path_factory.mktemp("prepared") / "data"
    return out_dir, run_prepare([corpus[0]], out_dir)


def test_records_hold_every_document_once_in_its_split_and_decode_to_its_text(corpus, prepared):
    _, documents = corpus
    out_dir, _ = prepared
    keys_in_id_order = sorted(documents)  # each directory's files come before its subdirectories
    processor = spm.SentencePieceProcessor(model_file=str(out_dir / "spm.model"))
    ids = []
    for split in ("train", "validation"):
        for record in [r for shard in read_split(out_dir, split) for r in shard]:
            key = keys_in_id_order[record["id"]]
            assert processor.decode(record["targets"]) == documents[key]
            assert spm_vocabulary.EOS_ID not in record["targets"]
            assert corpus_lib.split_of(f"code/{key}", seed=0, validation_fraction=0.2) == split
            ids.append(record["id"])
    assert sorted(ids) == list(range(len(documents)))


def test_metadata_matches_records_and_shards_are_round_robin(prepared):
    out_dir, metadata = prepared
    on_disk = json.loads((out_dir / "metadata.json").read_text())
    assert on_disk == {k: metadata[k] for k in on_disk}
    assert on_disk["format_version"] == 1 and on_disk["vocabulary"] == "spm.model"
    assert on_disk["vocab_size"] == VOCAB_SIZE
    assert metadata["input_mb"] > 0 and metadata["tokenize_mb_per_s"] > 0
    for split, info in on_disk["splits"].items():
        shards = read_split(out_dir, split)
        assert len(shards) == info["num_shards"] == len(list(out_dir.glob(info["pattern"])))
        records = [r for shard in shards for r in shard]
        assert len(records) == info["num_examples"] > 0
        assert sum(len(r["targets"]) for r in records) == info["num_tokens"]
        ids = sorted(r["id"] for r in records)
        for i, shard in enumerate(shards):
            assert [r["id"] for r in shard] == ids[i::len(shards)]
    assert on_disk["splits"]["train"]["num_shards"] == 3
    assert not list(out_dir.glob("*.tmp"))


def test_same_inputs_give_identical_files(corpus, prepared, tmp_path):
    out_dir, _ = prepared
    again = tmp_path / "again"
    run_prepare([corpus[0]], again)
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (out_dir / name).read_bytes() == (again / name).read_bytes(), name


def test_another_process_with_other_workers_gives_identical_files(corpus, prepared, tmp_path):
    """Same bytes from a fresh process with 1 worker as from this one with 2 (protobuf's map
    order and SentencePiece's thread count must not leak into the output)."""
    import subprocess
    import sys

    out_dir, _ = prepared
    again = tmp_path / "again"
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "t5x_lite.data.preparation.prepare", f"--input={corpus[0]}", f"--out={again}",
                    f"--vocab_size={VOCAB_SIZE}", "--num_shards=3", "--validation_fraction=0.2",
                    "--num_workers=1"], cwd=root, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(root)})
    for path in sorted(out_dir.iterdir()):
        assert path.read_bytes() == (again / path.name).read_bytes(), path.name


def test_vocabulary_keeps_code_whitespace(prepared):
    out_dir, _ = prepared
    processor = spm.SentencePieceProcessor(model_file=str(out_dir / "spm.model"))
    code = "class Item:\n    def total(self):\n        return  1\n\n\tx = 'é→'\n"
    assert processor.decode(processor.encode(code)) == code
    assert (processor.pad_id(), processor.eos_id(), processor.unk_id(), processor.bos_id()) == (0, 1, 2, -1)


def test_split_depends_only_on_key_and_seed():
    keys = [f"dir/file_{i}.txt" for i in range(2000)]
    splits = [corpus_lib.split_of(k, seed=0, validation_fraction=0.1) for k in keys]
    assert splits == [corpus_lib.split_of(k, seed=0, validation_fraction=0.1) for k in keys]
    assert 100 < splits.count("validation") < 300
    assert splits != [corpus_lib.split_of(k, seed=1, validation_fraction=0.1) for k in keys]


def test_jsonl_field_selection(tmp_path):
    rows = [{"content": f"{' '.join(random.Random(i).choices(WORDS, k=30))}\nline two {i}\n",
             "text": "ignored"} for i in range(40)]
    lines = [json.dumps(r) for r in rows]
    lines.insert(5, "")  # blank lines are skipped
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("\n".join(lines[:20]) + "\n")
    with gzip.open(tmp_path / "in" / "b.jsonl.gz", "wt") as f:
        f.write("\n".join(lines[20:]) + "\n")

    run_prepare([tmp_path / "in"], tmp_path / "out", jsonl_field="content", vocab_size=300)

    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "out" / "spm.model"))
    decoded = {r["id"]: processor.decode(r["targets"]) for split in corpus_lib.SPLITS
               for shard in read_split(tmp_path / "out", split) for r in shard}
    assert [decoded[i] for i in range(len(rows))] == [r["content"] for r in rows]
    documents = list(corpus_lib.iter_documents(corpus_lib.resolve_inputs([str(tmp_path / "in")]), "content"))
    assert documents[5].key == "in/a.jsonl:7"  # 1-based line numbers, after the blank line 6


def test_jsonl_missing_field_names_file_and_line(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "ok"}\n{"body": "no text here"}\n')
    with pytest.raises(corpus_lib.PrepareError, match=r"a\.jsonl:2 .*'text'.*--jsonl_field"):
        run_prepare([tmp_path / "a.jsonl"], tmp_path / "out")


def test_glob_filters_directory_files(corpus):
    root, documents = corpus
    keys = [s.key for s in corpus_lib.resolve_inputs([str(root)], glob="*.py")]
    assert keys == sorted(f"code/{k}" for k in [*documents, "pkg/empty.py"] if k.endswith(".py"))


@pytest.mark.parametrize("kwargs, message", [
    (dict(inputs=["does/not/exist"]), r"'does/not/exist' does not exist.*--input"),
    (dict(glob="*.rs"), r"No input files .*--glob='\*\.rs'.*Check --input and --glob"),
    (dict(vocab_size=8), r"--vocab_size=8 is too small.*at least 260"),
    (dict(vocab_size=100_000), r"--vocab_size=100000 is too large.*Lower --vocab_size"),
    (dict(validation_fraction=1e-6), r"validation split is empty.*Raise --validation_fraction"),
])
def test_errors_name_the_fix(corpus, tmp_path, kwargs, message):
    inputs = kwargs.pop("inputs", [corpus[0]])
    with pytest.raises(corpus_lib.PrepareError, match=message):
        run_prepare(inputs, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out" / "metadata.json").exists()


def test_no_documents_in_empty_files(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "blank.txt").write_text("\n\n")
    with pytest.raises(corpus_lib.PrepareError, match="No documents found"):
        run_prepare([tmp_path / "in"], tmp_path / "out")


def test_prepared_out_dir_is_refused_unless_overwrite(corpus, prepared, tmp_path):
    out_dir, _ = prepared
    with pytest.raises(corpus_lib.PrepareError, match="already holds a prepared dataset.*--overwrite"):
        run_prepare([corpus[0]], out_dir)

    copy = tmp_path / "copy"
    copy.mkdir()
    for path in out_dir.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    (copy / "train-00000-of-00009.tfrecord").write_bytes(b"stale")
    metadata = run_prepare([corpus[0]], copy, num_shards=2, overwrite=True)
    assert metadata["splits"]["train"]["num_shards"] == 2
    assert sorted(p.name for p in copy.glob("train-*")) == [
        "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]


def test_vocab_model_is_copied(corpus, prepared, tmp_path):
    out_dir, _ = prepared
    metadata = run_prepare([corpus[0]], tmp_path / "out", vocab_model=str(out_dir / "spm.model"),
                           vocab_size=1)
    assert (tmp_path / "out" / "spm.model").read_bytes() == (out_dir / "spm.model").read_bytes()
    assert metadata["vocab_size"] == VOCAB_SIZE
    assert (tmp_path / "out" / "spm.vocab").read_bytes() == (out_dir / "spm.vocab").read_bytes()


def test_long_text_is_cut_into_sentences_under_the_limit():
    text = "short line\n" + "é" * 10_000 + "x\n" + "tail"
    sentences = list(spm_vocabulary._sentences(text, max_bytes=1000))
    assert "".join(sentences) == text
    assert all(len(s.encode()) < 1000 for s in sentences)


def test_python_stdlib_files_skip_tests_and_site_packages():
    files = corpus_lib.python_stdlib_files()
    assert files and all(f.endswith(".py") for f in files)
    parts = {part for f in files for part in Path(f).parts}
    assert not parts & {"site-packages", "test", "tests", "idle_test"}
    assert any(f.endswith(os.path.join("json", "decoder.py")) for f in files)


def test_main_reports_missing_input_and_writes_nothing(tmp_path, capsys):
    out_dir = tmp_path / "out"
    assert prep.main([f"--input={tmp_path / 'missing'}", f"--out={out_dir}"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (out_dir / "metadata.json").exists()


def test_main_prepares_a_corpus(corpus, tmp_path, capsys):
    code = prep.main([f"--input={corpus[0]}", f"--out={tmp_path / 'out'}", "--vocab_size=320",
                      "--num_shards=2", "--validation_fraction=0.2", "--num_workers=1"])
    assert code == 0
    assert "documents" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "metadata.json").read_text())["splits"]["train"]["num_shards"] == 2


def test_vocab_sample_is_uniform_and_order_independent():
    documents = [corpus_lib.Document(i, f"doc_{i}", f"{i:03d}".ljust(100, "x")) for i in range(100)]
    forward, backward = corpus_lib.VocabSample(1000, seed=0), corpus_lib.VocabSample(1000, seed=0)
    for document in documents:
        forward.offer(document, 100)
    for document in reversed(documents):
        backward.offer(document, 100)
    assert forward.num_bytes == backward.num_bytes == 1000
    assert forward.texts() == backward.texts() == sorted(forward.texts())
    assert forward.texts() != [d.text for d in documents[:10]]  # spread out, not the first ones


def test_interrupted_write_leaves_no_shards(corpus, tmp_path, monkeypatch):
    def failing_tokenize(documents, **_):
        yield next(iter(documents)), [5, 6]
        raise KeyboardInterrupt

    monkeypatch.setattr(spm_vocabulary, "tokenize", failing_tokenize)
    with pytest.raises(KeyboardInterrupt):
        run_prepare([corpus[0]], tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["spm.model", "spm.vocab"]
