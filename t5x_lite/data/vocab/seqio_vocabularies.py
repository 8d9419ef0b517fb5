"""The seqio vocabularies of this folder's vocabularies, for seqio's tasks and tf.data: `as_seqio`.

The only vocabulary module that imports TensorFlow and seqio. A SentencePiece model with seqio's
ids becomes seqio's own `SentencePieceVocabulary` (equal to any other of the same file, as a
mixture needs; on s3:// it reads a local copy, since tf.io.gfile cannot open s3). A Hugging Face
tokenizer becomes a seqio subclass whose Python side is the object it was made of (`native`):
`HfSentencePieceVocabulary` keeps tensorflow_text's ops for a SentencePiece model and blanks what
follows EOS with EOS (not with id 0, which for LLaMA decodes to " ⁇ "); `SeqioTokenizerJsonVocabulary`
runs the Python tokenizer inside tf.data through `tf.py_function`, so both paths give the same ids.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from t5x_lite import storage
from t5x_lite.data.vocab.base import Vocabulary
from t5x_lite.data.vocab.sentencepiece_vocabulary import LoadedModel, SentencePieceVocabulary
from t5x_lite.data.vocab.tokenizer_json import TokenizerJsonVocabulary
from t5x_lite.tf_setup import import_tensorflow

tf = import_tensorflow()  # first, so that seqio finds it quiet and off the GPUs

import seqio  # noqa: E402


def as_seqio(vocabulary: Any) -> seqio.Vocabulary:
    """The seqio vocabulary of `vocabulary` (one of this folder's); a seqio vocabulary as it is."""
    if isinstance(vocabulary, seqio.Vocabulary):
        return vocabulary
    if isinstance(vocabulary, SentencePieceVocabulary):
        if vocabulary.ids is not None:
            return HfSentencePieceVocabulary(vocabulary)
        if storage.is_s3(vocabulary.path):
            return S3SentencePieceVocabulary(vocabulary.path, extra_ids=vocabulary.extra_ids)
        return seqio.SentencePieceVocabulary(vocabulary.path, extra_ids=vocabulary.extra_ids)
    if isinstance(vocabulary, TokenizerJsonVocabulary):
        return SeqioTokenizerJsonVocabulary(vocabulary)
    raise TypeError(f"{vocabulary!r} is neither a seqio vocabulary nor one of t5x_lite.data.vocab's.")


class S3SentencePieceVocabulary(seqio.SentencePieceVocabulary):
    """A SentencePiece model on s3://, which seqio's loader (tf.io.gfile) cannot open.

    It is loaded from a local copy made on first use, on each machine: the object keeps its
    s3 path, so a copy pickled to a Beam worker downloads the model there.
    """

    def __init__(self, path: str, *, extra_ids: int = 0):
        super().__init__(path, extra_ids=extra_ids)
        self._s3_path = path

    def _model_context(self):
        if self._model is None:
            self._sentencepiece_model_file = storage.tensorflow_readable(self._s3_path)
        return super()._model_context()


def _native(name: str) -> property:
    """A read-only attribute answered by the vocabulary's `native` object."""
    return property(lambda self: getattr(self.native, name), doc=f"The native vocabulary's `{name}`.")


class _Native:
    """seqio's Python side of a vocabulary, answered by the vocabulary it was made of (`native`)."""

    native: Vocabulary
    ids = _native("ids")
    files = _native("files")
    decoder_start_id = _native("decoder_start_id")
    zero_is_token = _native("zero_is_token")
    bos_id = _native("bos_id")
    eos_id = _native("eos_id")
    unk_id = _native("unk_id")
    pad_id = _native("pad_id")
    extra_ids = _native("extra_ids")
    vocab_size = _native("vocab_size")
    _base_vocab_size = _native("_base_vocab_size")

    def encode(self, s: str) -> list[int]:
        return self.native.encode(s)

    def decode(self, ids: Any) -> str:
        return self.native.decode(ids)

    def _encode(self, s: str) -> list[int]:
        return self.native._encode(s)

    def _decode(self, ids: list[int]) -> str:
        return self.native._decode(ids)

    def __eq__(self, other):
        return type(other) is type(self) and other.native == self.native

    def __hash__(self):
        return hash(self.native)


class HfSentencePieceVocabulary(_Native, seqio.SentencePieceVocabulary):
    """A SentencePiece model with the special ids of its Hugging Face folder (`native.ids`).

    `decoder_start_id` is BOS (else EOS); `zero_is_token` says id 0 is a real token (LLaMA's
    <unk>) unless it is the padding (Gemma's and T5's <pad>). `extra_ids` adds sentinels as
    seqio does (T5's <extra_id_N>, highest first).
    """

    def __init__(self, native: SentencePieceVocabulary):
        self.native = native
        super().__init__(native.path, extra_ids=native.extra_ids)

    def _model_context(self) -> LoadedModel:
        return self.native.model()  # its tokenizer and sp_model: tensorflow_text's ops read the latter

    sentencepiece_model_file = _native("path")

    def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        """Decodes [..., length] ids through the first EOS; what follows it decodes to nothing."""
        ids = tf.convert_to_tensor(ids, tf.int32)
        if ids.shape == (0,):
            return tf.constant(b"", dtype=tf.string)
        if self.unk_id is not None:
            ids = tf.where(ids < self._base_vocab_size, ids, self.unk_id)
        if self.eos_id is not None:  # EOS is a control piece: it decodes to an empty string
            after_eos = tf.cumsum(tf.cast(tf.equal(ids, self.eos_id), tf.int32), exclusive=True, axis=-1)
            ids = tf.where(after_eos > 0, self.eos_id, ids)
        return self._decode_tf(ids)

    def __str__(self) -> str:
        return f"HfSentencePieceVocabulary(file={self.native.path}, extra_ids={self.extra_ids}, {self.ids})"


class SeqioTokenizerJsonVocabulary(_Native, seqio.Vocabulary):
    """A tokenizer.json with its special ids (`native`), in seqio's Python and TensorFlow interfaces."""

    def __init__(self, native: TokenizerJsonVocabulary):
        self.native = native
        super().__init__(extra_ids=0)

    tokenizer = _native("tokenizer")  # the `tokenizers.Tokenizer`, loaded on first use
    path = _native("path")

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor | tf.RaggedTensor:
        """A scalar string -> its [length] ids; a vector of strings -> a [rows, (length)] RaggedTensor."""
        s = tf.convert_to_tensor(s, tf.string)
        if s.shape.rank == 0:
            ids = tf.py_function(lambda text: np.asarray(self._encode(text.numpy().decode("utf-8")), np.int32),
                                 [s], tf.int32)
            ids.set_shape([None])
            return ids
        if s.shape.rank != 1:
            raise ValueError(f"encode_tf takes a string scalar or vector, not rank {s.shape.rank}.")
        return tf.map_fn(self._encode_tf, s, fn_output_signature=tf.RaggedTensorSpec([None], tf.int32))

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        """[..., length] ids -> [...] strings, each row decoded as `decode` does."""
        ids = tf.convert_to_tensor(ids, tf.int32)
        shape = tf.shape(ids)[:-1]

        def decode_rows(rows):
            return np.asarray([self._decode(row).encode("utf-8") for row in rows.numpy().tolist()], dtype=object)

        texts = tf.py_function(decode_rows, [tf.reshape(ids, [-1, tf.shape(ids)[-1]])], tf.string)
        return tf.reshape(texts, shape)

    def __str__(self) -> str:
        return f"TokenizerJsonVocabulary(file={self.native.path}, {self.ids})"
