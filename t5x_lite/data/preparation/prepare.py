"""Text, jsonl and Parquet → a SentencePiece vocabulary and sharded, tokenized TFRecords.

`python -m t5x_lite.data.preparation.prepare --input=DIR_FILE_OR_GLOB --out=DATA_DIR` writes to DATA_DIR:

  spm.model, spm.vocab                 SentencePiece unigram model (pad 0, eos 1, unk 2, no bos), or
  tokenizer/                           with --tokenizer: a copy of a Hugging Face tokenizer (its ids
                                       in metadata.json's `tokenizer`)
  train-SSSSS-of-NNNNN.tfrecord        tf.train.Examples: `targets` (token ids, no EOS), `id`
  validation-SSSSS-of-NNNNN.tfrecord
  metadata.json                        written last: splits, counts, vocabulary size, seed

DATA_DIR may also be gs://BUCKET/PREFIX or s3://BUCKET/PREFIX: the dataset is prepared in a
local temporary directory, then uploaded (metadata.json last).

Documents are whole files, or one per line of `.jsonl` files (also `.jsonl.gz`, `.jsonl.zst`;
the text under --jsonl_field), or one per row of `.parquet` files (the string column
--text_column), read as they stream (formats.py). Each document's text is kept exactly (newlines,
indentation, tabs), so the vocabulary suits source code as well as prose.

`--tokenizer=PATH` tokenizes with a Hugging Face tokenizer instead of training a vocabulary: a
tokenizer.json, a SentencePiece tokenizer.model, a Hugging Face model folder, or a converted
model directory (its hf/). The ids are the tokenizer's own, without BOS or EOS (tasks append
EOS; the feature converter puts the tokenizer's BOS, else EOS, first); its size is checked
against the model's config.json `vocab_size` when the path has one.

This module is the `t5x-lite prepare` command: its flags, checks and the steps in order. The
steps live in `corpus` (inputs, splits, vocabulary sample), `spm_vocabulary` (training the
vocabulary, tokenizing), `hf_vocabulary` (a Hugging Face tokenizer), `shards` (the shards) and
`prepared_dataset` (metadata.json).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

from t5x_lite import host_memory, storage
from t5x_lite.data.preparation import corpus, formats, shards, spm_vocabulary
from t5x_lite.data.preparation.corpus import PYTHON_STDLIB, PrepareError
from t5x_lite.data.records import prepared_dataset
from t5x_lite.data.records.prepared_dataset import METADATA_FILE, VOCAB_FILE
from t5x_lite.data.vocab import hf_vocabulary, tokenizer_files
from t5x_lite.errors import UserError

DEFAULT_VOCAB_SIZE = 8192


def _default_num_workers() -> int:
    if hasattr(os, "sched_getaffinity"):  # the CPUs this process may use (containers, SLURM)
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _check_options(*, vocab_size: int | None, num_shards: int, validation_fraction: float,
                   vocab_sample_bytes: int, num_workers: int, vocab_model: str | None,
                   tokenizer: str | None) -> None:
    if tokenizer is not None and (vocab_model is not None or vocab_size is not None):
        raise PrepareError(f"--tokenizer={tokenizer!r} brings its own vocabulary: drop "
                           + ("--vocab_model" if vocab_model is not None else "--vocab_size") + ".")
    vocab_size = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
    if vocab_model is None and tokenizer is None and vocab_size < spm_vocabulary.MIN_VOCAB_SIZE:
        raise PrepareError(
            f"--vocab_size={vocab_size} is too small: the vocabulary holds 256 byte-fallback "
            f"pieces plus pad/eos/unk and the corpus's characters. Use --vocab_size of at least "
            f"{spm_vocabulary.MIN_VOCAB_SIZE} (8192 or more for real corpora)."
        )
    if min(num_shards, num_workers, vocab_sample_bytes) < 1:
        raise PrepareError("--num_shards, --num_workers and --vocab_sample_bytes must be positive.")
    if not 0.0 < validation_fraction < 1.0:
        raise PrepareError(f"--validation_fraction={validation_fraction} must be between 0 and "
                           "1 (exclusive); 0.05 is typical.")


def _check_out_dir(out_dir: str, overwrite: bool) -> None:
    if os.path.exists(os.path.join(out_dir, METADATA_FILE)) and not overwrite:
        raise PrepareError(f"{out_dir!r} already holds a prepared dataset ({METADATA_FILE}). "
                           "Choose another --out, or pass --overwrite to replace it.")


def _check_splits(num_documents: dict[str, int], inputs: Sequence[str]) -> None:
    if not sum(num_documents.values()):
        raise PrepareError(f"No documents found in {', '.join(inputs)}: every file is empty "
                           "(or every jsonl line, every Parquet row is blank). Check --input and --glob.")
    if not num_documents["validation"]:
        raise PrepareError(
            f"The validation split is empty ({num_documents['train']} documents, all in train). "
            "Raise --validation_fraction or add more documents."
        )
    if not num_documents["train"]:
        raise PrepareError("The train split is empty. Lower --validation_fraction or add data.")


def _describe(inputs: Sequence[str], glob: str | None, num_files: int) -> str:
    names = ", ".join(inputs[:3]) + (f" and {len(inputs) - 3} more" if len(inputs) > 3 else "")
    return f"{names} ({num_files} files" + (f" matching {glob!r})" if glob else ")")


def _count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(int(n))


def _hf_tokenizer(path: str) -> tuple[tokenizer_files.TokenizerSource, object]:
    """The tokenizer --tokenizer names and its vocabulary, checked: readable, with an EOS, and no
    larger than the model's vocab_size (config.json beside it) when there is a model."""
    source = tokenizer_files.find(path)
    vocabulary = hf_vocabulary.load(source)
    size = vocabulary.vocab_size  # reads the file: a malformed one fails here, before anything is written
    if vocabulary.eos_id is None:
        raise PrepareError(f"{source.path} names no EOS token (no eos_token_id in config.json, no eos_token in "
                           "tokenizer_config.json or special_tokens_map.json): put the model folder's JSON files "
                           "beside it, or pass --tokenizer the model folder itself.")
    model_vocab_size = tokenizer_files.read_json(source.folder, "config.json").get("vocab_size")
    if isinstance(model_vocab_size, int) and size > model_vocab_size:
        raise PrepareError(
            f"The tokenizer {source.path} has {size} ids but the model beside it "
            f"({storage.join(source.folder, 'config.json')}) has vocab_size={model_vocab_size}: ids "
            f"{model_vocab_size}..{size - 1} would have no embedding. Pass the model's own tokenizer (its folder "
            "or its converted model directory).")
    return source, vocabulary


def prepare(*, inputs: Sequence[str], out_dir: str, vocab_size: int | None = None, num_shards: int = 4,
            validation_fraction: float = 0.05, jsonl_field: str = "text", text_column: str = "text",
            glob: str | None = None, vocab_sample_bytes: int = 20_000_000, num_workers: int | None = None, seed: int = 0,
            vocab_model: str | None = None, tokenizer: str | None = None, overwrite: bool = False,
            log: Callable[[str], None] = print) -> dict:
    """Prepares `inputs` (files, directories, glob patterns or `python_stdlib`) as a dataset in `out_dir`.

    Each document goes to validation with probability `validation_fraction`, decided by a stable
    hash of its key (path relative to its input, `path:line` for jsonl, without a .gz or .zst suffix,
    `path:row` for Parquet) and `seed`. The unigram vocabulary is trained on a deterministic sample
    of about `vocab_sample_bytes` of training text (`vocab_size` pieces, default 8192), unless
    `vocab_model` names an existing model to copy or `tokenizer` a Hugging Face tokenizer to use
    (see the module docstring). Train gets `num_shards` shards,
    validation min(num_shards, its documents). Outputs are identical for the same inputs and
    seed, whatever `num_workers` (the vocabulary trainer always uses VOCAB_TRAINER_THREADS).
    Returns the metadata in `metadata.json`, plus `input_mb`, `tokenize_mb_per_s` and `seconds`.
    A gs:// or s3:// `out_dir` is prepared locally first, then uploaded (`prepare_remote`).
    """
    if storage.is_url(out_dir):
        return prepare_remote(**locals())  # the arguments, as given
    start = time.perf_counter()
    num_workers = _default_num_workers() if num_workers is None else num_workers
    _check_options(vocab_size=vocab_size, num_shards=num_shards, num_workers=num_workers,
                   validation_fraction=validation_fraction, vocab_sample_bytes=vocab_sample_bytes,
                   vocab_model=vocab_model, tokenizer=tokenizer)
    vocab_size = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
    _check_out_dir(out_dir, overwrite)
    hf_source, hf_vocab = _hf_tokenizer(tokenizer) if tokenizer else (None, None)
    read_options = formats.ReadOptions(jsonl_field=jsonl_field, text_column=text_column)
    sources = corpus.text_sources(corpus.resolve_inputs(inputs, glob), log,  # binary files skipped, named
                                  options=read_options)
    survey = corpus.survey(corpus.iter_documents(sources, jsonl_field, text_column), seed=seed,
                           validation_fraction=validation_fraction,
                           vocab_sample_bytes=vocab_sample_bytes)
    _check_splits(survey.num_documents, inputs)
    shards.clear_outputs(out_dir)

    make_encoder = None
    if hf_source is not None:
        copy = hf_vocabulary.copy_for_prepared(hf_source, out_dir)
        encoder = (spm_vocabulary.sentencepiece_encoder if copy.kind == "sentencepiece"
                   else spm_vocabulary.tokenizer_json_encoder)
        make_encoder = functools.partial(encoder, copy.path)
        vocabulary_entry = {"vocab_size": hf_vocab.vocab_size, "vocabulary": f"{hf_vocabulary.PREPARED_SUBDIR}/"
                            f"{copy.file}", "tokenizer": hf_vocabulary.metadata_entry(copy, hf_vocab, given=storage.absolute(tokenizer))}
        log(f"tokenizing with {hf_source.path} ({hf_vocab.vocab_size} ids; eos {hf_vocab.eos_id}, decoder start "
            f"{hf_vocab.decoder_start_id}{', id 0 a real token' if hf_vocab.zero_is_token else ''}) ...")
    else:
        if vocab_model:
            model = spm_vocabulary.read_vocabulary(vocab_model)
        else:
            log(f"training a {vocab_size}-piece vocabulary on {survey.sample.num_bytes / 1e6:.1f} MB "
                f"of {survey.input_bytes / 1e6:.1f} MB ...")
            model = spm_vocabulary.train_vocabulary(survey.sample.texts(), vocab_size=vocab_size,
                                                    seed=seed,
                                                    num_threads=spm_vocabulary.VOCAB_TRAINER_THREADS)
        spm_vocabulary.write_vocabulary(model, os.path.join(out_dir, os.path.splitext(VOCAB_FILE)[0]))
        vocabulary_entry = {"vocab_size": spm_vocabulary.vocab_size_of(model), "vocabulary": VOCAB_FILE}
    model_file = os.path.join(out_dir, VOCAB_FILE)

    tokenize_start = time.perf_counter()
    num_shards_per_split = {"train": num_shards,
                            "validation": min(num_shards, survey.num_documents["validation"])}
    encoded = spm_vocabulary.tokenize(corpus.iter_documents(sources, jsonl_field, text_column),
                                      model_file=model_file, num_workers=num_workers, make_encoder=make_encoder)
    splits = shards.write_shards(encoded, out_dir=out_dir, num_shards=num_shards_per_split,
                                           seed=seed, validation_fraction=validation_fraction)
    tokenize_seconds = time.perf_counter() - tokenize_start

    metadata = {
        "format_version": prepared_dataset.FORMAT_VERSION,
        **vocabulary_entry,
        "splits": splits,
        "sources": _describe(inputs, glob, len(sources)),
        "seed": seed,
    }
    prepared_dataset.write_metadata(out_dir, metadata)

    input_mb = survey.input_bytes / 1e6
    result = {**metadata, "input_mb": round(input_mb, 3),
              "tokenize_mb_per_s": round(input_mb / tokenize_seconds, 3),
              "seconds": round(time.perf_counter() - start, 3)}
    num_tokens = sum(split["num_tokens"] for split in splits.values())
    log(f"prepared {sum(survey.num_documents.values())} documents ({input_mb:.1f} MB) -> "
        f"{_count(num_tokens)} tokens in {splits['train']['num_shards']} train + "
        f"{splits['validation']['num_shards']} validation shards; tokenized at "
        f"{result['tokenize_mb_per_s']:.1f} MB/s ({out_dir})")
    return result


def prepare_remote(*, out_dir: str, overwrite: bool = False,
                   log: Callable[[str], None] = print, **options) -> dict:
    """`prepare` into a local temporary directory, then upload it to a gs:// or s3:// `out_dir`.

    An earlier dataset there loses its metadata.json first and gets the new one last, so
    readers never take a half-uploaded directory for a prepared one.
    """
    bucket = storage.bucket_of(out_dir)
    if not storage.exists(bucket):
        raise PrepareError(f"Bucket {bucket} of --out={out_dir} does not exist or is not "
                           "accessible; create it, or fix the name or the credentials.")
    if storage.exists(storage.join(out_dir, METADATA_FILE)) and not overwrite:
        raise PrepareError(f"{out_dir!r} already holds a prepared dataset ({METADATA_FILE}). "
                           "Choose another --out, or pass --overwrite to replace it.")
    with tempfile.TemporaryDirectory(prefix="t5x_lite_prepare_") as staging:
        result = prepare(out_dir=staging, log=log, **options)
        if storage.exists(out_dir):
            for name in storage.listdir(out_dir):  # metadata.json sorts before the shards
                name = name.rstrip("/")
                if name == hf_vocabulary.PREPARED_SUBDIR:
                    storage.remove_tree(storage.join(out_dir, name))
                elif shards.is_output(name):
                    storage.remove(storage.join(out_dir, name))
        files = [os.path.relpath(os.path.join(d, f), staging) for d, _, names in os.walk(staging) for f in names]
        for name in sorted(files, key=lambda name: name == METADATA_FILE):
            storage.copy(os.path.join(staging, name), storage.join(out_dir, *name.split(os.sep)))
    log(f"uploaded to {out_dir}")
    return result


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t5x-lite prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", action="append", required=True, dest="inputs",
                   help="file, directory or quoted glob pattern (repeatable), or "
                   f"{PYTHON_STDLIB}; read by suffix: .jsonl, .jsonl.gz, .jsonl.zst, .parquet, else whole text files")
    p.add_argument("--out", required=True, dest="out_dir",
                   help="directory to write (local, gs://BUCKET/PREFIX or s3://BUCKET/PREFIX)")
    p.add_argument("--vocab_size", type=int, help=f"pieces of the vocabulary to train (default {DEFAULT_VOCAB_SIZE})")
    p.add_argument("--num_shards", type=int, default=4)
    p.add_argument("--validation_fraction", type=float, default=0.05)
    p.add_argument("--jsonl_field", default="text", help="text field of .jsonl(.gz/.zst) records")
    p.add_argument("--text_column", default="text", help="string column of .parquet files")
    p.add_argument("--glob", help='file-name filter inside directories, e.g. "*.py"')
    p.add_argument("--vocab_sample_bytes", type=int, default=20_000_000,
                   help="training text used to learn the vocabulary")
    p.add_argument("--num_workers", type=int, help="processes (default: all usable CPUs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab_model", help="existing SentencePiece .model to use instead of training")
    p.add_argument("--tokenizer", help="a Hugging Face tokenizer to use instead of training: a tokenizer.json, "
                   "a tokenizer.model, a Hugging Face model folder or a converted model directory")
    p.add_argument("--overwrite", action="store_true", help="replace a prepared --out")
    return p


def main(argv: list[str] | None = None) -> int:
    """Command line for `prepare`; returns 2 (after printing why) when the inputs are unusable."""
    args = _parser().parse_args(argv)
    try:
        prepare(**vars(args))
    except UserError as e:  # PrepareError, StorageError, a tokenizer that cannot be used
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    host_memory.run_program(main)
