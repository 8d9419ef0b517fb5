"""A Hugging Face `tokenizer.json` as a seqio vocabulary (GPT-2's, Qwen2's and Gemma's byte-level or
byte-fallback BPE, and any other the `tokenizers` library reads).

The `tokenizers` package (pinned in requirements/torch.txt, `make install-torch`) does the work;
TensorFlow's side (`encode_tf`/`decode_tf`, what seqio's `tokenize` preprocessor calls inside
tf.data) runs the same Python tokenizer through `tf.py_function`, so both give the same ids.
Text is encoded without special tokens (no BOS, no EOS: seqio appends EOS, the feature converter
puts the decoder start first); decoding stops at the first EOS.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from t5x_lite import storage
from t5x_lite.data.vocab.tokenizer_files import SpecialIdProperties, SpecialIds, TokenizerError
from t5x_lite.errors import MissingExtraError
from t5x_lite.tf_setup import import_tensorflow

tf = import_tensorflow()  # first, so that seqio finds it quiet and off the GPUs

import seqio  # noqa: E402

_load_lock = threading.Lock()


def import_tokenizers(path: str):
    """The `tokenizers` package, or one clear error saying how to install it."""
    try:
        import tokenizers  # optional: only tokenizer.json vocabularies need it
    except ImportError:
        raise MissingExtraError(f"{path} is a Hugging Face tokenizer.json, which needs the `tokenizers` package: run "
                                "`make install-torch` (requirements/torch.txt pins it).") from None
    return tokenizers


def load_tokenizer(path: str) -> Any:
    """The `tokenizers.Tokenizer` of `path` (local, gs:// or s3://); TokenizerError when it is not one."""
    tokenizers = import_tokenizers(path)
    with storage.open(path, "rb") as f:
        text = f.read()
    try:
        return tokenizers.Tokenizer.from_str(text.decode("utf-8"))
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise TokenizerError(f"{path} is not a tokenizer.json the `tokenizers` library can read ({e}). Name the "
                             "tokenizer.json of a Hugging Face model folder, or its SentencePiece tokenizer.model.") \
            from None


class TokenizerJsonVocabulary(SpecialIdProperties, seqio.Vocabulary):
    """A tokenizer.json with its special ids, in seqio's Python and TensorFlow interfaces.

    `vocab_size` is the largest id plus one (added tokens included). `decoder_start_id` is BOS
    (else EOS); `zero_is_token` says id 0 is a real token (GPT-2's "!") unless it is the padding.
    """

    def __init__(self, path: str, *, ids: SpecialIds, extra_ids: int = 0):
        if extra_ids:
            raise TokenizerError(f"{path} is a tokenizer.json, which has no room for {extra_ids} sentinel ids "
                                 "(span corruption's); use a SentencePiece tokenizer.model for that task.")
        self.path = path
        self.ids = ids
        self._tokenizer = None
        self._size: int | None = None
        super().__init__(extra_ids=0)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_tokenizer"] = None  # loaded again where it is used (a Beam worker, a prepare worker)
        return state

    @property
    def tokenizer(self) -> Any:
        """The `tokenizers.Tokenizer`, loaded on first use."""
        if self._tokenizer is None:
            with _load_lock:
                if self._tokenizer is None:
                    self._tokenizer = load_tokenizer(self.path)
        return self._tokenizer

    @property
    def files(self) -> list[str]:
        """The tokenizer file (what a run copies into MODEL_DIR/hf/)."""
        return [self.path]

    @property
    def _base_vocab_size(self) -> int:
        if self._size is None:  # seqio reads it on every decode: counted once
            self._size = max(self.tokenizer.get_vocab(with_added_tokens=True).values()) + 1
        return self._size

    def _encode(self, s: str) -> Sequence[int]:
        return self.tokenizer.encode(s, add_special_tokens=False).ids

    def _decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        if self.eos_id is not None and self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        return self.tokenizer.decode([i for i in ids if i >= 0], skip_special_tokens=False)

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

    def __eq__(self, other):
        return isinstance(other, TokenizerJsonVocabulary) and (self.path, self.ids) == (other.path, other.ids)

    def __hash__(self):
        return hash((self.path, self.ids))

    def __str__(self) -> str:
        return f"TokenizerJsonVocabulary(file={self.path}, {self.ids})"

