"""A Hugging Face `tokenizer.json` as the vocabulary of a converted model (GPT-2's byte-level BPE).

t5x_lite's own vocabularies are SentencePiece models (vocab/spm.model); a GPT-2 folder has none,
so `t5x-lite sample`, `infer` and multiple-choice `eval` tokenize its text with the folder's
tokenizer.json through the `tokenizers` library (pinned in requirements/torch.txt).
"""

from __future__ import annotations

from typing import Iterable

from t5x_lite import storage
from t5x_lite.errors import TaskDataError


class TokenizerJsonVocabulary:
    """encode / decode / eos_id: the part of seqio.Vocabulary that sampling, inference and scoring use."""

    def __init__(self, path: str, *, eos_id: int | None):
        try:
            import tokenizers  # optional: only tokenizer.json vocabularies need it
        except ImportError:
            raise TaskDataError(f"{path} is a Hugging Face tokenizer, which needs the `tokenizers` package: "
                                "run `make install-torch` (requirements/torch.txt pins it).") from None

        with storage.open(path, "rb") as f:
            self._tokenizer = tokenizers.Tokenizer.from_str(f.read().decode("utf-8"))
        self.path = path
        self.eos_id = eos_id

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens (a BOS or EOS is the caller's choice)."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids` up to the first EOS, as seqio's vocabularies decode."""
        ids = [int(i) for i in ids]
        if self.eos_id is not None and self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        return self._tokenizer.decode(ids, skip_special_tokens=False)
