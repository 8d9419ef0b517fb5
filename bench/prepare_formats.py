"""prepare_formats: `prepare` MB/s on the same text as .jsonl, .jsonl.gz, .jsonl.zst and .parquet.

The corpus: the Python standard library's source files (--quick: its json and urllib packages),
one document each, written once in every format: the same documents in the same order (jsonl
records {"text": ...}; gzip level 6; Zstandard level 3; Parquet with one string column `text`,
Snappy pages, row groups of --row_group_mb of text). A vocabulary of --vocab_size pieces is
trained once on the jsonl (not timed); then, --repeats times in rotation, each format is:

  read      its documents alone (`corpus.iter_documents`: decompress, parse, pick the field or
            column), in this process;
  prepared  by the whole `prepare` command with that vocabulary (--vocab_model): the survey
            pass, tokenizing with all cores (the same process pool for every format), writing.

MB/s counts the documents' UTF-8 text (the same MB in every format, so the rates compare) and, in
its own column, the input files' bytes on disk. The best of the repeats is kept. Every format's
shards are compared with the jsonl's: byte for byte for the compressed jsonl (which names its
documents as the jsonl does), token for token by document id for Parquet (whose rows are keyed
`file.parquet:ROW`, so its split differs). Goal: Parquet prepares at least as fast as plain jsonl.
"""

from __future__ import annotations

import gzip
import json
import os
import sysconfig
import tempfile
import time

from bench import common

FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst", "parquet")
DEFAULTS = {"repeats": 3, "vocab_size": 4096, "vocab_sample_bytes": 4_000_000, "row_group_mb": 64,
            "num_workers": 0, "validation_fraction": 0.05}
QUICK = {"repeats": 1, "vocab_size": 512, "vocab_sample_bytes": 500_000, "validation_fraction": 0.3}


def add_arguments(parser) -> None:
    parser.add_argument("--repeats", type=int, help=f"timed rounds over the formats (default {DEFAULTS['repeats']})")
    parser.add_argument("--vocab_size", type=int, help=f"pieces of the vocabulary (default {DEFAULTS['vocab_size']})")
    parser.add_argument("--vocab_sample_bytes", type=int, help="text the vocabulary is trained on "
                        f"(default {DEFAULTS['vocab_sample_bytes']:,}; not timed)")
    parser.add_argument("--row_group_mb", type=int, help=f"Parquet row group size, MB of text (default "
                        f"{DEFAULTS['row_group_mb']})")
    parser.add_argument("--num_workers", type=int, help="prepare's processes (default 0: all usable cores)")
    parser.add_argument("--validation_fraction", type=float, help=f"prepare's (default {DEFAULTS['validation_fraction']})")


def stdlib_documents(quick: bool) -> list[str]:
    from t5x_lite.data.preparation import corpus

    if quick:
        stdlib = sysconfig.get_paths()["stdlib"]
        sources = corpus.resolve_inputs([os.path.join(stdlib, "json"), os.path.join(stdlib, "urllib")], "*.py")
        paths = [source.path for source in sources]
    else:
        paths = corpus.python_stdlib_files()
    texts = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            text = f.read()
        if text.strip():
            texts.append(text)
    return texts


def write_corpora(root: str, texts: list[str], row_group_mb: int) -> dict[str, str]:
    """{format: the input directory holding `corpus/docs.<format>`}."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    lines = "".join(json.dumps({"text": text}) + "\n" for text in texts).encode()
    inputs = {}
    for name in FORMATS:
        folder = os.path.join(root, name.replace(".", "_"), "corpus")
        os.makedirs(folder)
        path = os.path.join(folder, f"docs.{name}")
        if name == "parquet":
            text_bytes = sum(len(t.encode()) for t in texts)
            rows = max(1, len(texts) * row_group_mb * 10**6 // max(text_bytes, 1))
            pq.write_table(pa.table({"text": texts}), path, row_group_size=rows)
        else:
            compress = {"jsonl": bytes, "jsonl.gz": lambda data: gzip.compress(data, compresslevel=6, mtime=0),
                        "jsonl.zst": zstandard.ZstdCompressor(level=3).compress}[name]
            with open(path, "wb") as f:
                f.write(compress(lines))
        inputs[name] = folder
    return inputs


def tokens_by_id(out_dir: str) -> dict[int, bytes]:
    """Each document's token ids (as bytes), by document id, from every shard of both splits."""
    import glob

    from t5x_lite.data.records import example_codec, record_frame

    records = []
    for shard in sorted(glob.glob(os.path.join(out_dir, "*-of-*.tfrecord"))):
        with open(shard, "rb") as f:
            offset = 0
            while (frame := record_frame.read_frame(f, offset)) is not None:
                records.append(frame.data)
                offset = frame.end
    ids = [int(values[0]) for values in example_codec.int64_feature(records, "id")]
    return dict(zip(ids, (values.tobytes() for values in example_codec.int64_feature(records, "targets"))))


def shard_bytes(out_dir: str) -> dict[str, bytes]:
    """Every file of a prepared directory but metadata.json (which names the input)."""
    files = {}
    for name in sorted(os.listdir(out_dir)):
        if name != "metadata.json":
            with open(os.path.join(out_dir, name), "rb") as f:
                files[name] = f.read()
    return files


def measure(settings: dict, root: str) -> tuple[list[list], dict]:
    from t5x_lite.data.preparation import corpus, prepare

    common.progress("writing the corpus in every format")
    texts = stdlib_documents(settings["quick"])
    text_mb = sum(len(t.encode()) for t in texts) / 1e6
    inputs = write_corpora(root, texts, settings["row_group_mb"])
    file_mb = {name: sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)) / 1e6
               for name, d in inputs.items()}
    workers = settings["num_workers"] or None
    common.progress(f"training the {settings['vocab_size']}-piece vocabulary (not timed)")
    vocab_dir = os.path.join(root, "vocab")
    prepare.prepare(inputs=[inputs["jsonl"]], out_dir=vocab_dir, vocab_size=settings["vocab_size"],
                    vocab_sample_bytes=settings["vocab_sample_bytes"], num_workers=workers,
                    validation_fraction=settings["validation_fraction"], log=lambda _: None)
    vocab_model = os.path.join(vocab_dir, "spm.model")

    read_s = {name: float("inf") for name in FORMATS}
    prepare_s = dict(read_s)
    tokenize_rate = dict.fromkeys(FORMATS, 0.0)
    for repeat in range(settings["repeats"]):
        for name in FORMATS:
            common.progress(f"round {repeat + 1}/{settings['repeats']}: {name}")
            sources = corpus.resolve_inputs([inputs[name]])
            start = time.perf_counter()
            read_mb = sum(len(d.text.encode()) for d in corpus.iter_documents(sources)) / 1e6
            read_s[name] = min(read_s[name], time.perf_counter() - start)
            assert abs(read_mb - text_mb) < 1e-6, (name, read_mb, text_mb)
            start = time.perf_counter()
            result = prepare.prepare(inputs=[inputs[name]], out_dir=os.path.join(root, f"out_{name}"),
                                     vocab_model=vocab_model, num_workers=workers, overwrite=True,
                                     validation_fraction=settings["validation_fraction"], log=lambda _: None)
            prepare_s[name] = min(prepare_s[name], time.perf_counter() - start)
            tokenize_rate[name] = max(tokenize_rate[name], result["tokenize_mb_per_s"])

    reference = os.path.join(root, "out_jsonl")
    reference_tokens = tokens_by_id(reference)
    rows = []
    for name in FORMATS:
        out_dir = os.path.join(root, f"out_{name}")
        if name == "parquet":
            same = "same tokens" if tokens_by_id(out_dir) == reference_tokens else "DIFFERENT tokens"
        elif name == "jsonl":
            same = "(reference)"
        else:
            same = "same bytes" if shard_bytes(out_dir) == shard_bytes(reference) else "DIFFERENT bytes"
        rows.append([name, f"{file_mb[name]:.1f}", f"{text_mb / read_s[name]:,.1f}", f"{prepare_s[name]:.2f}",
                     f"{text_mb / prepare_s[name]:.2f}", f"{file_mb[name] / prepare_s[name]:.2f}",
                     f"{tokenize_rate[name]:.2f}", same])
    summary = {"text_mb": text_mb, "documents": len(texts), "prepare_s": prepare_s, "read_s": read_s,
               "parquet_over_jsonl": prepare_s["jsonl"] / prepare_s["parquet"]}
    return rows, summary


def run(args, command: str) -> dict:
    settings = {"quick": args.quick, **common.resolve(args, DEFAULTS, QUICK)}
    with tempfile.TemporaryDirectory(prefix="bench_prepare_formats_") as root:
        rows, summary = measure(settings, root)
    print(common.header(command))
    print()
    print(f"{summary['documents']:,} documents, {summary['text_mb']:.1f} MB of text in every format; "
          f"prepare with a fixed vocabulary, {settings['num_workers'] or common.usable_cores()} processes")
    print()
    print(common.table(["input", "file MB", "read MB/s (text)", "prepare s", "prepare MB/s (text)",
                        "prepare MB/s (file)", "tokenize + write MB/s", "shards against jsonl"], rows))
    print()
    ratio = summary["parquet_over_jsonl"]
    print(f"parquet / jsonl, prepare MB/s of the same text: {ratio:.2f}x "
          f"(goal: at least 1.00x: {'met' if ratio >= 1.0 else 'NOT met'}); best of {settings['repeats']} "
          "rounds each; read MB/s is this process alone, prepare's includes both passes over the input")
    print(common.settings_line(settings))
    return summary
