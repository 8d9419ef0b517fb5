"""seqio's Python interface of a vocabulary, without TensorFlow: what every vocabulary here keeps.

`encode` gives a text's ids (no EOS added); `decode` maps ids past `_base_vocab_size` to UNK and
decodes through the first EOS, as seqio's `Vocabulary.decode` does; id 0 is the padding
(`pad_id`), seqio's convention. The seqio classes made of these objects
(`seqio_vocabularies.as_seqio`) call these same methods, so the rules live here once.
"""

from __future__ import annotations

import abc
from typing import Any, Iterable

PAD_ID = 0  # seqio's padding id, whatever the tokenizer calls its own padding


class Vocabulary(abc.ABC):
    """A vocabulary's Python side: `encode`, `decode`, `vocab_size`, the special ids, `extra_ids`."""

    def __init__(self, *, extra_ids: int = 0):
        self._extra_ids = extra_ids or 0

    @property
    def extra_ids(self) -> int:
        """The sentinel ids added after the tokenizer's own (span corruption's)."""
        return self._extra_ids

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    @abc.abstractmethod
    def bos_id(self) -> int | None:
        ...

    @property
    @abc.abstractmethod
    def eos_id(self) -> int | None:
        ...

    @property
    @abc.abstractmethod
    def unk_id(self) -> int | None:
        ...

    @property
    @abc.abstractmethod
    def _base_vocab_size(self) -> int:
        """The ids `decode` keeps; larger ones decode as UNK."""

    @property
    def vocab_size(self) -> int:
        """Every id, the extra ones included."""
        return self._base_vocab_size + self.extra_ids

    @abc.abstractmethod
    def _encode(self, s: str) -> list[int]:
        ...

    @abc.abstractmethod
    def _decode(self, ids: list[int]) -> str:
        ...

    def encode(self, s: str) -> list[int]:
        """The ids of `s`, without BOS or EOS."""
        return list(self._encode(s))

    def decode(self, ids: Iterable[int] | Any) -> str:
        """The text of `ids` (a list, a NumPy array, an eager tensor) up through the first EOS."""
        if hasattr(ids, "numpy"):  # an eager tensor: one conversion, not one per element
            ids = ids.numpy()
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        clean = [int(i) for i in ids]
        if self.unk_id is not None:
            size = self._base_vocab_size
            clean = [self.unk_id if i >= size else i for i in clean]
        if self.eos_id is not None and self.eos_id in clean:
            clean = clean[:clean.index(self.eos_id) + 1]
        return self._decode(clean)
