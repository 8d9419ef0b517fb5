"""Language-modelling tasks over raw text files, tokenized when read.

Each split is a file pattern of jsonl files (one JSON object per line, the document in a
string field) or TFRecord files (tf.train.Example with the document in a bytes feature).
Files are seqio's unit of sharding and shuffling (`seqio.FileDataSource`): with at least as
many files as data shards each host reads only its own files (with fewer, seqio reads them all
on every host and shards the examples). The text is tokenized with a SentencePiece
model, a Hugging Face tokenizer (data/vocab/hf_vocabulary.py) or seqio's byte vocabulary, long
documents are split into pieces of the targets length (with room for EOS), and EOS is appended.
`t5x-lite cache` stores the tokenized text (up to the CacheDatasetPlaceholder); a run reading
that cache (use_cached=True) reads it by index (data/indexed/index_plan.py).

A record without usable text (a jsonl line that is not a JSON object with a string field, a
TFRecord without exactly one value of the feature) stops reading with an error naming the
file and line (on_bad_line='fail'), or is skipped (on_bad_line='skip'): the source counts
the skipped records per file (`TextSource.bad_records`) and logs a warning at the 1st, 10th,
100th, ... of each file. Blank jsonl lines are not records and are passed over.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os

from google.protobuf.message import DecodeError

from t5x_lite.data.indexed import index_plan
from t5x_lite.data.tasks.lm import replace_task
from t5x_lite.data.vocab import hf_vocabulary, seqio_vocabularies
from t5x_lite.errors import TaskDataError
from t5x_lite.tf_setup import import_tensorflow

tf = import_tensorflow()

import seqio  # noqa: E402
from t5.data import preprocessors as t5_preprocessors  # noqa: E402

FILE_FORMATS = ("jsonl", "tfrecord")
ON_BAD_LINE = ("skip", "fail")
BYTE_VOCABULARY = "byte"


class TextSource(seqio.FileDataSource):
    """Documents of jsonl or TFRecord files as {'text': string}, with bad records skipped or fatal."""

    def __init__(self, split_to_filepattern: dict[str, str], *, file_format: str, text_field: str,
                 on_bad_line: str):
        self.text_field = text_field
        self.on_bad_line = on_bad_line
        self._unit = "line" if file_format == "jsonl" else "record"
        self._bad: dict[str, set[int]] = {}
        reader = self._read_jsonl if file_format == "jsonl" else self._read_tfrecord
        super().__init__(read_file_fn=reader, split_to_filepattern=split_to_filepattern)

    @property
    def bad_records(self) -> dict[str, int]:
        """Skipped records per file so far (each counted once, however often the file is read)."""
        return {path: len(numbers) for path, numbers in self._bad.items()}

    def list_shards(self, split: str) -> list[str]:
        if split not in self._split_to_filepattern:
            raise TaskDataError(f"This text task has no split {split!r}; its splits are "
                                f"{sorted(self._split_to_filepattern)}. Add a pattern for it to the "
                                "task's splits or read one of those.")
        return super().list_shards(split)

    def _bad_record(self, path: str, number: int, problem: str) -> None:
        """Counts a skipped record, or raises naming it (on_bad_line='fail')."""
        if self.on_bad_line == "fail":
            raise TaskDataError(f"{path}, {self._unit} {number}: {problem}. Fix or remove it, or register the "
                                "task with on_bad_line='skip' to skip and count such records.")
        numbers = self._bad.setdefault(path, set())
        if number in numbers:
            return
        numbers.add(number)
        if math.log10(len(numbers)).is_integer():
            logging.warning("Skipped %d bad %s(s) of %s so far (%s %d: %s).", len(numbers), self._unit, path,
                            self._unit, number, problem)

    def _read_jsonl(self, path: tf.Tensor) -> tf.data.Dataset:
        return tf.data.Dataset.from_generator(self._jsonl_texts, args=(path,),
                                              output_signature={"text": tf.TensorSpec([], tf.string)})

    def _jsonl_texts(self, path: bytes):
        path = path.decode()
        with tf.io.gfile.GFile(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                text, problem = parse_jsonl_line(line, self.text_field)
                if problem:
                    self._bad_record(path, number, problem)
                else:
                    yield {"text": text}

    def _read_tfrecord(self, path: tf.Tensor) -> tf.data.Dataset:
        spec = {self.text_field: tf.io.VarLenFeature(tf.string)}

        def values(number, record):
            return number, tf.io.parse_single_example(record, spec)[self.text_field].values

        def usable(number, texts):
            # The Python call happens only for bad records.
            return tf.cond(tf.size(texts) == 1, lambda: tf.constant(True),
                           lambda: tf.py_function(self._bad_tfrecord, [path, number, tf.size(texts)], tf.bool))

        records = tf.data.TFRecordDataset(path).enumerate(start=1).map(values)
        return records.filter(usable).map(lambda _, texts: {"text": texts[0]})

    def _bad_tfrecord(self, path: tf.Tensor, number: tf.Tensor, size: tf.Tensor) -> bool:
        self._bad_record(path.numpy().decode(), int(number), f"{int(size)} values of bytes feature "
                         f"{self.text_field!r} (needs exactly one)")
        return False


def parse_jsonl_line(line: bytes, field: str) -> tuple[str | None, str | None]:
    """(text, None) for a JSON object with a string `field`, else (None, what is wrong)."""
    try:
        record = json.loads(line)
    except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError for bytes that are not UTF-8
        return None, f"not valid JSON ({e})"
    text = record.get(field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        return None, f"no string field {field!r}"
    return text, None


def file_format_of(patterns: list[str]) -> str:
    """'jsonl' or 'tfrecord', from the file names of the patterns."""
    kinds = {kind for pattern in patterns for kind in FILE_FORMATS if f".{kind}" in os.path.basename(pattern)}
    if len(kinds) != 1:
        raise TaskDataError(f"Cannot tell the file format of {patterns} from their names; set the text "
                            f"task's file_format to one of {list(FILE_FORMATS)}.")
    return kinds.pop()


def check_split_files(splits: dict[str, str]) -> None:
    """Every split's pattern matches files, none of them empty."""
    if not splits:
        raise TaskDataError("A text task needs splits, for example {'train': 'data/*.train.jsonl'}.")
    for split, pattern in splits.items():
        files = tf.io.gfile.glob(pattern)
        if not files:
            raise TaskDataError(f"The pattern {pattern!r} of split {split!r} matches no files; fix the "
                                "pattern (relative patterns are read from the current directory).")
        empty = [f for f in files if tf.io.gfile.stat(f).length == 0]
        if empty:
            raise TaskDataError(f"{len(empty)} of the {len(files)} files of split {split!r} are empty, for "
                                f"example {empty[0]!r}; remove them or narrow the pattern {pattern!r}.")


def load_vocabulary(vocabulary: str) -> seqio.Vocabulary:
    """seqio's byte vocabulary for 'byte'; a Hugging Face tokenizer (with the model's own special ids) for a
    tokenizer.json, a Hugging Face folder or a converted model directory; else the SentencePiece model at
    that path, read now."""
    if vocabulary == BYTE_VOCABULARY:
        return seqio.ByteVocabulary()
    path = os.path.expanduser(vocabulary)
    if path.endswith(".json") or os.path.isdir(path):
        loaded = hf_vocabulary.load_path(path)
        loaded.vocab_size  # reads the tokenizer now rather than later inside tf.data
        return seqio_vocabularies.as_seqio(loaded)
    loaded = seqio.SentencePieceVocabulary(path)
    try:
        loaded.tokenizer  # reads the model now rather than later inside tf.data
    except (tf.errors.OpError, DecodeError, RuntimeError) as e:
        raise TaskDataError(f"Cannot read the SentencePiece vocabulary {path!r} ({e}). Point the text task's "
                            "vocabulary at a SentencePiece .model file (such as the spm.model that "
                            f"`t5x-lite prepare` writes) or set it to {BYTE_VOCABULARY!r}.") from None
    return loaded


def register_text_task(name: str, splits: dict[str, str], vocabulary: str, *, file_format: str | None = None,
                       text_field: str = "text", on_bad_line: str = "fail") -> seqio.Task:
    """Registers (or re-registers) an LM task `name` over raw text files; checks them first."""
    if on_bad_line not in ON_BAD_LINE:
        raise TaskDataError(f"on_bad_line={on_bad_line!r}; choose one of {list(ON_BAD_LINE)}.")
    if file_format is not None and file_format not in FILE_FORMATS:
        raise TaskDataError(f"file_format={file_format!r}; choose one of {list(FILE_FORMATS)} (or None to "
                            "tell from the file names).")
    splits = {split: os.path.expanduser(pattern) for split, pattern in splits.items()}
    check_split_files(splits)
    vocab = load_vocabulary(vocabulary)
    source = TextSource(splits, file_format=file_format or file_format_of(list(splits.values())),
                        text_field=text_field, on_bad_line=on_bad_line)
    task = replace_task(
        name,
        source=source,
        preprocessors=[
            functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),
            functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False),
            # `t5x-lite cache` stores the tokenized text up to here (read by index when cached).
            seqio.CacheDatasetPlaceholder(),
            t5_preprocessors.split_tokens_to_targets_length,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features={"targets": seqio.Feature(vocabulary=vocab, add_eos=True)},
    )
    index_plan.register_lm_task(name, task, None)
    return task


@functools.cache
def _registered(name: str, splits: tuple[tuple[str, str], ...], vocabulary: str, file_format: str | None,
                text_field: str, on_bad_line: str) -> str:
    register_text_task(name, dict(splits), vocabulary, file_format=file_format, text_field=text_field,
                       on_bad_line=on_bad_line)
    return name


def text_task(*, name: str, splits: dict[str, str], vocabulary: str, file_format: str | None = None,
              text_field: str = "text", on_bad_line: str = "fail") -> str:
    """Registers the text LM task `name` once and returns its name (for gin)."""
    return _registered(name, tuple(sorted(splits.items())), vocabulary, file_format, text_field, on_bad_line)
