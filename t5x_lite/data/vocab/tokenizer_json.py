"""A Hugging Face `tokenizer.json` as a vocabulary (GPT-2's, Qwen2's and Gemma's byte-level or
byte-fallback BPE, and any other the `tokenizers` library reads), without TensorFlow or seqio.

The `tokenizers` package (pinned in requirements/torch.txt, `make install-torch`) does the work.
Text is encoded without special tokens (no BOS, no EOS: seqio appends EOS, the feature converter
puts the decoder start first); decoding stops at the first EOS. Its seqio vocabulary
(`seqio_vocabularies.as_seqio`) runs these same methods inside tf.data.
"""

from __future__ import annotations

import threading
from typing import Any

from t5x_lite import storage
from t5x_lite.data.vocab.base import Vocabulary
from t5x_lite.data.vocab.tokenizer_files import SpecialIdProperties, SpecialIds, TokenizerError
from t5x_lite.errors import MissingExtraError

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


class TokenizerJsonVocabulary(SpecialIdProperties, Vocabulary):
    """A tokenizer.json with its special ids, in seqio's Python interface.

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
        if self._size is None:  # `decode` reads it every time: counted once
            self._size = max(self.tokenizer.get_vocab(with_added_tokens=True).values()) + 1
        return self._size

    def _encode(self, s: str) -> list[int]:
        return self.tokenizer.encode(s, add_special_tokens=False).ids

    def _decode(self, ids: list[int]) -> str:
        ids = [int(i) for i in ids]
        if self.eos_id is not None and self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        return self.tokenizer.decode([i for i in ids if i >= 0], skip_special_tokens=False)

    def __eq__(self, other):
        return isinstance(other, TokenizerJsonVocabulary) and (self.path, self.ids) == (other.path, other.ids)

    def __hash__(self):
        return hash((self.path, self.ids))

    def __str__(self) -> str:
        return f"TokenizerJsonVocabulary(file={self.path}, {self.ids})"

