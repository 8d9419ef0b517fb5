"""Text and jsonl → a SentencePiece vocabulary and sharded, tokenized TFRecords.

`python -m t5x_lite.prepare --input=DIR_OR_FILE --out=DATA_DIR` writes to DATA_DIR:

  spm.model, spm.vocab                 SentencePiece unigram model (pad 0, eos 1, unk 2, no bos)
  train-SSSSS-of-NNNNN.tfrecord        tf.train.Examples: `targets` (token ids, no EOS), `id`
  validation-SSSSS-of-NNNNN.tfrecord
  metadata.json                        written last: splits, counts, vocabulary size, seed

DATA_DIR may also be gs://BUCKET/PREFIX or s3://BUCKET/PREFIX: the dataset is prepared in a
local temporary directory, then uploaded (metadata.json last).

Documents are whole files, or one per line of `.jsonl`/`.jsonl.gz` files. Each document's text is
kept exactly (newlines, indentation, tabs), so the vocabulary suits source code as well as prose.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import functools
import gzip
import hashlib
import heapq
import io
import json
import multiprocessing
import os
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import sentencepiece as spm

from t5x_lite import storage
from t5x_lite.errors import UserError
from t5x_lite.tf_setup import import_tensorflow

PYTHON_STDLIB = "python_stdlib"
FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
VOCAB_FILE = "spm.model"
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
# Byte fallback reserves 256 byte pieces; with pad/eos/unk at least one learned piece must remain.
MIN_VOCAB_SIZE = 260
# Fixed, not the machine's core count: SentencePiece's result depends on its thread count, and
# the same corpus should give the same vocabulary on every machine.
VOCAB_TRAINER_THREADS = 4
MAX_SENTENCE_BYTES = 16384
_STDLIB_EXCLUDED_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
_SPLITS = ("train", "validation")
_TMP_SUFFIX = ".tmp"
_BATCH_CHARS = 1 << 20  # text sent to a worker at a time
_WINDOW_CHARS = 64 << 20  # text in flight between this process and the workers


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


class _VocabSample:
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
class _Survey:
    num_documents: dict[str, int]
    input_bytes: int
    sample: _VocabSample


def _survey(documents: Iterable[Document], *, seed: int, validation_fraction: float,
            vocab_sample_bytes: int) -> _Survey:
    """Counts documents per split and samples training text for the vocabulary, in one pass."""
    survey = _Survey(dict.fromkeys(_SPLITS, 0), 0, _VocabSample(vocab_sample_bytes, seed))
    for document in documents:
        num_bytes = len(document.text.encode())
        survey.input_bytes += num_bytes
        split = split_of(document.key, seed=seed, validation_fraction=validation_fraction)
        survey.num_documents[split] += 1
        if split == "train":
            survey.sample.offer(document, num_bytes)
    return survey


# ---------------------------------------------------------------------------- vocabulary


def _sentences(text: str, max_bytes: int = MAX_SENTENCE_BYTES) -> Iterator[str]:
    """`text` as consecutive chunks of whole lines (newlines kept), each under `max_bytes`."""
    chunk, chunk_bytes = [], 0
    for line in _pieces_under(text.splitlines(keepends=True), max_bytes):
        line_bytes = len(line.encode())
        if chunk and chunk_bytes + line_bytes > max_bytes:
            yield "".join(chunk)
            chunk, chunk_bytes = [], 0
        chunk.append(line)
        chunk_bytes += line_bytes
    if chunk:
        yield "".join(chunk)


def _pieces_under(lines: Iterable[str], max_bytes: int) -> Iterator[str]:
    """The lines, with any line of `max_bytes` or more cut into pieces that fit."""
    for line in lines:
        while len(line.encode()) >= max_bytes:
            cut = len(line.encode()[:max_bytes - 1].decode(errors="ignore"))
            yield line[:cut]
            line = line[cut:]
        if line:
            yield line


def train_vocabulary(texts: Sequence[str], *, vocab_size: int, seed: int,
                     num_threads: int) -> bytes:
    """Trains a SentencePiece unigram model on `texts` and returns it serialized.

    Whitespace is kept as is (identity normalization, no dummy prefix, whitespace-only pieces
    allowed) so that code round-trips exactly; digits are split; the rarest 0.05% of characters
    (and any never seen) fall back to bytes, so small vocabularies work on corpora with many
    distinct characters. The result is deterministic for the same texts, seed and `num_threads`
    (the trainer's sums depend on how the work is split over threads).
    """
    model = io.BytesIO()  # not a file prefix: the model stores it, and would differ by out_dir
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=(s for text in texts for s in _sentences(text)),
            model_writer=model, model_type="unigram", vocab_size=vocab_size,
            pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
            byte_fallback=True, character_coverage=0.9995, split_digits=True,
            normalization_rule_name="identity", remove_extra_whitespaces=False,
            add_dummy_prefix=False, allow_whitespace_only_pieces=True,
            max_sentence_length=MAX_SENTENCE_BYTES, input_sentence_size=0,
            shuffle_input_sentence=False, num_threads=num_threads, minloglevel=2,
        )
    except RuntimeError as e:
        raise PrepareError(_vocab_size_advice(str(e), vocab_size)) from e
    return model.getvalue()


def _vocab_size_advice(message: str, vocab_size: int) -> str:
    if "too high" in message:
        return (f"--vocab_size={vocab_size} is too large for this corpus ({message.strip()}). "
                "Lower --vocab_size or add data.")
    if "smaller than required_chars" in message:
        return (f"--vocab_size={vocab_size} is too small to hold every character of the corpus "
                f"plus 256 byte pieces ({message.strip()}). Raise --vocab_size.")
    return f"Training the SentencePiece vocabulary failed: {message.strip()}"


def read_vocabulary(vocab_model: str) -> bytes:
    """The serialized SentencePiece model in `vocab_model`, checked to use seqio's pad and eos."""
    try:
        processor = spm.SentencePieceProcessor(model_file=vocab_model)
    except (OSError, RuntimeError) as e:
        raise PrepareError(f"--vocab_model={vocab_model!r} is not a readable SentencePiece "
                           f"model ({e}). Pass an existing .model file.") from e
    if (processor.pad_id(), processor.eos_id()) != (PAD_ID, EOS_ID):
        raise PrepareError(
            f"--vocab_model={vocab_model!r} has pad_id={processor.pad_id()}, "
            f"eos_id={processor.eos_id()}; seqio needs pad_id={PAD_ID}, eos_id={EOS_ID}. "
            "Use a model trained with those ids, or leave out --vocab_model to train one."
        )
    with open(vocab_model, "rb") as f:
        return f.read()


def write_vocabulary(model: bytes, model_prefix: str) -> None:
    """Writes `<model_prefix>.model` and the `.vocab` listing (piece<TAB>score) SentencePiece does."""
    with open(f"{model_prefix}.model", "wb") as f:
        f.write(model)
    processor = spm.SentencePieceProcessor(model_proto=model)
    with open(f"{model_prefix}.vocab", "w", encoding="utf-8") as f:
        for i in range(processor.vocab_size()):
            f.write(f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n")


# -------------------------------------------------------------------------- tokenization

_worker_processor: spm.SentencePieceProcessor | None = None


def _init_worker(model_file: str) -> None:
    global _worker_processor
    _worker_processor = spm.SentencePieceProcessor(model_file=model_file)


def _encode_batch(texts: list[str]) -> list[list[int]]:
    return _worker_processor.encode(texts, num_threads=1)


def _batched(documents: Iterable[Document], max_chars: int) -> Iterator[list[Document]]:
    """Consecutive documents in lists of about `max_chars` characters (at least one each)."""
    batch, batch_chars = [], 0
    for document in documents:
        batch.append(document)
        batch_chars += len(document.text)
        if batch_chars >= max_chars:
            yield batch
            batch, batch_chars = [], 0
    if batch:
        yield batch


def tokenize(documents: Iterable[Document], *, model_file: str,
             num_workers: int) -> Iterator[tuple[Document, list[int]]]:
    """(document, token ids without EOS) in document order, encoded by `num_workers` processes.

    At most about 64 MB of text is in flight at once, so corpora larger than memory stream.
    """
    context = multiprocessing.get_context("spawn")
    with context.Pool(num_workers, initializer=_init_worker, initargs=(model_file,)) as pool:
        for window in _batched(documents, _WINDOW_CHARS):
            batches = list(_batched(window, _BATCH_CHARS))
            encoded = pool.imap(_encode_batch, [[d.text for d in batch] for batch in batches])
            for batch, ids in zip(batches, encoded):
                yield from zip(batch, ids)


# ---------------------------------------------------------------------------------- shards


@functools.cache
def shard_paths(out_dir: str, split: str, num_shards: int) -> list[str]:
    """`<out_dir>/<split>-SSSSS-of-NNNNN.tfrecord` for each shard."""
    return [os.path.join(out_dir, f"{split}-{i:05d}-of-{num_shards:05d}.tfrecord")
            for i in range(num_shards)]


class _SplitWriter:
    """Writes one split round-robin over its shards, under temporary names until `commit`."""

    def __init__(self, tf, paths: list[str]):
        self._tf = tf
        self._paths = paths
        self._writers = [tf.io.TFRecordWriter(path + _TMP_SUFFIX) for path in paths]
        self.num_examples = 0
        self.num_tokens = 0

    def write(self, document_id: int, ids: list[int]) -> None:
        feature = self._tf.train.Feature
        example = self._tf.train.Example(features=self._tf.train.Features(feature={
            "targets": feature(int64_list=self._tf.train.Int64List(value=ids)),
            "id": feature(int64_list=self._tf.train.Int64List(value=[document_id])),
        }))
        # Deterministic: protobuf may order the feature map differently in another process.
        record = example.SerializeToString(deterministic=True)
        self._writers[self.num_examples % len(self._writers)].write(record)
        self.num_examples += 1
        self.num_tokens += len(ids)

    def close(self) -> None:
        for writer in self._writers:
            writer.close()

    def commit(self) -> None:
        """Gives the finished shards their final names."""
        for path in self._paths:
            os.replace(path + _TMP_SUFFIX, path)

    def discard(self) -> None:
        """Closes and deletes the unfinished shards."""
        self.close()
        for path in self._paths:
            if os.path.exists(path + _TMP_SUFFIX):
                os.remove(path + _TMP_SUFFIX)


def write_shards(encoded: Iterable[tuple[Document, list[int]]], *, out_dir: str,
                 num_shards: dict[str, int], seed: int,
                 validation_fraction: float) -> dict[str, dict]:
    """Writes each split's records round-robin in document order; returns each split's counts.

    Shards appear under their final names only once every shard is complete.
    """
    tf = import_tensorflow()
    writers = {split: _SplitWriter(tf, shard_paths(out_dir, split, num_shards[split]))
               for split in _SPLITS}
    try:
        for document, ids in encoded:
            split = split_of(document.key, seed=seed, validation_fraction=validation_fraction)
            writers[split].write(document.id, ids)
        for writer in writers.values():
            writer.close()
    except BaseException:
        for writer in writers.values():
            writer.discard()
        raise
    for writer in writers.values():
        writer.commit()
    return {split: {"pattern": f"{split}-*-of-*.tfrecord", "num_shards": num_shards[split],
                    "num_examples": writer.num_examples, "num_tokens": writer.num_tokens}
            for split, writer in writers.items()}


# --------------------------------------------------------------------------------- prepare


def _default_num_workers() -> int:
    if hasattr(os, "sched_getaffinity"):  # the CPUs this process may use (containers, SLURM)
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _check_options(*, vocab_size: int, num_shards: int, validation_fraction: float,
                   vocab_sample_bytes: int, num_workers: int, vocab_model: str | None) -> None:
    if vocab_model is None and vocab_size < MIN_VOCAB_SIZE:
        raise PrepareError(
            f"--vocab_size={vocab_size} is too small: the vocabulary holds 256 byte-fallback "
            f"pieces plus pad/eos/unk and the corpus's characters. Use --vocab_size of at least "
            f"{MIN_VOCAB_SIZE} (8192 or more for real corpora)."
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


def _is_output(name: str) -> bool:
    """Whether file `name` is the metadata or a shard of a prepared directory."""
    return name == METADATA_FILE or any(fnmatch.fnmatch(name, f"{split}-*-of-*.tfrecord*")
                                        for split in _SPLITS)


def _clear_outputs(out_dir: str) -> None:
    """Removes the metadata and shards of an earlier (possibly interrupted) run in `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(out_dir)):  # metadata.json sorts before the shards
        if _is_output(name):
            os.remove(os.path.join(out_dir, name))


def _check_splits(num_documents: dict[str, int], inputs: Sequence[str]) -> None:
    if not sum(num_documents.values()):
        raise PrepareError(f"No documents found in {', '.join(inputs)}: every file is empty "
                           "(or, for jsonl, every line is blank). Check --input and --glob.")
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


def read_metadata(data_dir: str) -> dict | None:
    """The metadata.json of a prepared directory (local, gs:// or s3://); None when it has none.

    A local directory is read without TensorFlow; storage.StorageError for an unreachable store.
    """
    path = storage.join(data_dir, METADATA_FILE)
    if not storage.is_url(data_dir):
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    if not storage.exists(path):
        return None
    with storage.open(path, "r") as f:
        return json.load(f)


def _write_json(path: str, value: dict) -> None:
    with open(path + _TMP_SUFFIX, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
    os.replace(path + _TMP_SUFFIX, path)


def prepare(*, inputs: Sequence[str], out_dir: str, vocab_size: int = 8192, num_shards: int = 4,
            validation_fraction: float = 0.05, jsonl_field: str = "text", glob: str | None = None,
            vocab_sample_bytes: int = 20_000_000, num_workers: int | None = None, seed: int = 0,
            vocab_model: str | None = None, overwrite: bool = False,
            log: Callable[[str], None] = print) -> dict:
    """Prepares `inputs` (files, directories or `python_stdlib`) as a dataset in `out_dir`.

    Each document goes to validation with probability `validation_fraction`, decided by a stable
    hash of its key (path relative to its input, `path:line` for jsonl) and `seed`. The unigram
    vocabulary is trained on a deterministic sample of about `vocab_sample_bytes` of training
    text, unless `vocab_model` names an existing model to copy. Train gets `num_shards` shards,
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
                   vocab_model=vocab_model)
    _check_out_dir(out_dir, overwrite)
    sources = resolve_inputs(inputs, glob)
    survey = _survey(iter_documents(sources, jsonl_field), seed=seed,
                     validation_fraction=validation_fraction, vocab_sample_bytes=vocab_sample_bytes)
    _check_splits(survey.num_documents, inputs)
    _clear_outputs(out_dir)

    if vocab_model:
        model = read_vocabulary(vocab_model)
    else:
        log(f"training a {vocab_size}-piece vocabulary on {survey.sample.num_bytes / 1e6:.1f} MB "
            f"of {survey.input_bytes / 1e6:.1f} MB ...")
        model = train_vocabulary(survey.sample.texts(), vocab_size=vocab_size, seed=seed,
                                 num_threads=VOCAB_TRAINER_THREADS)
    write_vocabulary(model, os.path.join(out_dir, os.path.splitext(VOCAB_FILE)[0]))
    model_file = os.path.join(out_dir, VOCAB_FILE)

    import_tensorflow()  # before the clock starts: the rate measures tokenizing and writing
    tokenize_start = time.perf_counter()
    num_shards_per_split = {"train": num_shards,
                            "validation": min(num_shards, survey.num_documents["validation"])}
    encoded = tokenize(iter_documents(sources, jsonl_field), model_file=model_file,
                       num_workers=num_workers)
    splits = write_shards(encoded, out_dir=out_dir, num_shards=num_shards_per_split, seed=seed,
                          validation_fraction=validation_fraction)
    tokenize_seconds = time.perf_counter() - tokenize_start

    metadata = {
        "format_version": FORMAT_VERSION,
        "vocab_size": spm.SentencePieceProcessor(model_proto=model).vocab_size(),
        "vocabulary": VOCAB_FILE,
        "splits": splits,
        "sources": _describe(inputs, glob, len(sources)),
        "seed": seed,
    }
    _write_json(os.path.join(out_dir, METADATA_FILE), metadata)

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
                if _is_output(name):
                    storage.remove(storage.join(out_dir, name))
        for name in sorted(os.listdir(staging), key=lambda name: name == METADATA_FILE):
            storage.copy(os.path.join(staging, name), storage.join(out_dir, name))
    log(f"uploaded to {out_dir}")
    return result


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t5x-lite prepare", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", action="append", required=True, dest="inputs",
                   help=f"file or directory (repeatable), or {PYTHON_STDLIB}")
    p.add_argument("--out", required=True, dest="out_dir",
                   help="directory to write (local, gs://BUCKET/PREFIX or s3://BUCKET/PREFIX)")
    p.add_argument("--vocab_size", type=int, default=8192)
    p.add_argument("--num_shards", type=int, default=4)
    p.add_argument("--validation_fraction", type=float, default=0.05)
    p.add_argument("--jsonl_field", default="text", help="text field of .jsonl records")
    p.add_argument("--glob", help='file-name filter inside directories, e.g. "*.py"')
    p.add_argument("--vocab_sample_bytes", type=int, default=20_000_000,
                   help="training text used to learn the vocabulary")
    p.add_argument("--num_workers", type=int, help="processes (default: all usable CPUs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab_model", help="existing SentencePiece .model to use instead of training")
    p.add_argument("--overwrite", action="store_true", help="replace a prepared --out")
    return p


def main(argv: list[str] | None = None) -> int:
    """Command line for `prepare`; returns 2 (after printing why) when the inputs are unusable."""
    args = _parser().parse_args(argv)
    try:
        prepare(**vars(args))
    except (PrepareError, storage.StorageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
