"""The SentencePiece vocabulary of a prepared dataset: training it, checking and writing it; tokenizing in workers.

The model uses seqio's ids (pad 0, eos 1, unk 2, no bos) and keeps whitespace exactly, so it suits
source code as well as prose. Training is deterministic (fixed seed and thread count); tokenizing
runs in worker processes and streams, so corpora larger than memory can be prepared, with this
model or with a Hugging Face tokenizer (`prepare --tokenizer`: its tokenizer.json or SentencePiece
tokenizer.model, encoded without BOS or EOS).
"""

from __future__ import annotations

import functools
import io
import itertools
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import sentencepiece as spm

from t5x_lite.data.preparation.corpus import Document, PrepareError

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
# Byte fallback reserves 256 byte pieces; with pad/eos/unk at least one learned piece must remain.
MIN_VOCAB_SIZE = 260
# Fixed, not the machine's core count: SentencePiece's result depends on its thread count, and
# the same corpus should give the same vocabulary on every machine.
VOCAB_TRAINER_THREADS = 4
MAX_SENTENCE_BYTES = 16384
_BATCH_CHARS = 1 << 20  # text sent to a worker at a time
_WINDOW_CHARS = 64 << 20  # text in flight between this process and the workers


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
            "Use a model trained with those ids, leave out --vocab_model to train one, or pass a Hugging Face "
            "model's tokenizer.model with --tokenizer (it keeps the model's own ids)."
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


def vocab_size_of(model: bytes) -> int:
    """The number of pieces of the serialized SentencePiece `model`."""
    return spm.SentencePieceProcessor(model_proto=model).vocab_size()


# -------------------------------------------------------------------------- tokenization

Encoder = Callable[[list[str]], list[list[int]]]  # texts -> their token ids (no BOS, no EOS)
_worker_encode: Encoder | None = None


def sentencepiece_encoder(model_file: str) -> Encoder:
    """A SentencePiece model's batch encoder (one thread: the worker pool gives the parallelism)."""
    processor = spm.SentencePieceProcessor(model_file=model_file)
    return lambda texts: processor.encode(texts, num_threads=1)


def tokenizer_json_encoder(path: str) -> Encoder:
    """A Hugging Face tokenizer.json's batch encoder, without special tokens (one thread, as above)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import tokenizers  # checked to import in the parent process (hf_vocabulary.load) before workers start

    tokenizer = tokenizers.Tokenizer.from_file(path)
    return lambda texts: [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


def _init_worker(make_encoder: Callable[[], Encoder]) -> None:
    global _worker_encode
    _worker_encode = make_encoder()


def _encode_batch(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The texts' token ids end to end (int64) and each text's count: two arrays to send back,
    cheaper to pickle and to write than a list of lists."""
    ids = _worker_encode(texts)
    return (np.fromiter(itertools.chain.from_iterable(ids), np.int64),
            np.fromiter(map(len, ids), np.int64, len(ids)))


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


def tokenize(documents: Iterable[Document], *, model_file: str | None = None, num_workers: int,
             make_encoder: Callable[[], Encoder] | None = None) -> Iterator[tuple[Document, np.ndarray]]:
    """(document, its token ids without BOS or EOS: an int64 array) in document order, encoded by
    `num_workers` processes.

    Each worker encodes with the SentencePiece `model_file`, or with what `make_encoder` (a picklable
    function, called in each worker: `functools.partial(tokenizer_json_encoder, path)`) returns.
    At most about 64 MB of text is in flight at once, so corpora larger than memory stream.
    """
    make_encoder = make_encoder or functools.partial(sentencepiece_encoder, model_file)
    context = multiprocessing.get_context("spawn")
    with context.Pool(num_workers, initializer=_init_worker, initargs=(make_encoder,)) as pool:
        for window in _batched(documents, _WINDOW_CHARS):
            batches = list(_batched(window, _BATCH_CHARS))
            encoded = pool.imap(_encode_batch, [[d.text for d in batch] for batch in batches])
            for batch, (ids, counts) in zip(batches, encoded):
                bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
                yield from ((document, ids[start:stop]) for document, start, stop in zip(batch, bounds, bounds[1:]))
