"""A SentencePiece model as a vocabulary, without TensorFlow or seqio: `t5x-lite prepare`'s spm.model
(seqio's ids) or a Hugging Face model's tokenizer.model (LLaMA, Mistral, Gemma, T5; its own ids).

Without `ids` it behaves as seqio's `SentencePieceVocabulary` does in Python: EOS, UNK and BOS
are the model's own, padding and the decoder start are 0, text is encoded without BOS or EOS,
`extra_ids` sentinel pieces are appended highest id first (T5's <extra_id_N>), and `decode` maps
ids past the model to UNK. With `ids` (`tokenizer_files.SpecialIds`, read from a Hugging Face
folder) the special ids are those instead, the decoder start is BOS (else EOS), and id 0 is a real
token unless it is the padding (LLaMA's <unk>; Gemma's and T5's <pad> is padding). The model is
read through `storage` (local, gs:// or s3://) on first use; a pickled copy reads it again.
"""

from __future__ import annotations

import dataclasses
import threading

import sentencepiece
from sentencepiece import sentencepiece_model_pb2

from t5x_lite import storage
from t5x_lite.data.vocab.base import Vocabulary
from t5x_lite.data.vocab.tokenizer_files import SpecialIds, TokenizerError

_load_lock = threading.Lock()  # SentencePiece's proto loading is not thread-safe (seqio's note)


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """The processor and the serialized model it was loaded from (sentinels included)."""

    tokenizer: sentencepiece.SentencePieceProcessor
    sp_model: bytes


def read_model(path: str) -> bytes:
    """The serialized SentencePiece model at `path`; TokenizerError when it is not one."""
    with storage.open(path, "rb") as f:
        model = f.read()
    try:
        sentencepiece.SentencePieceProcessor(model_proto=model)
    except (RuntimeError, TypeError) as e:
        raise TokenizerError(f"{path} is not a SentencePiece model ({e}). Name a SentencePiece .model file (a "
                             "Hugging Face folder's tokenizer.model, the spm.model of `t5x-lite prepare`) or a "
                             "Hugging Face tokenizer.json.") from None
    return model


def own_ids(model: bytes) -> SpecialIds:
    """The special ids a serialized SentencePiece model declares itself (-1: none)."""
    processor = sentencepiece.SentencePieceProcessor(model_proto=model)
    ids = {name: getattr(processor, f"{name}_id")() for name in ("bos", "eos", "pad", "unk")}
    return SpecialIds(**{name: value if value >= 0 else None for name, value in ids.items()})


def load_model(path: str, extra_ids: int) -> LoadedModel:
    """The model at `path` with `extra_ids` sentinel pieces appended, highest id first (seqio's and T5's order)."""
    model = read_model(path)
    if extra_ids:
        proto = sentencepiece_model_pb2.ModelProto.FromString(model)
        for i in reversed(range(extra_ids)):
            proto.pieces.add(piece=f"▁<extra_id_{i}>", score=0.0,
                             type=sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED)
        model = proto.SerializeToString()
    return LoadedModel(tokenizer=sentencepiece.SentencePieceProcessor(model_proto=model), sp_model=model)


class SentencePieceVocabulary(Vocabulary):
    """A SentencePiece model with seqio's ids (`ids` None) or a Hugging Face folder's (`ids`)."""

    def __init__(self, path: str, *, extra_ids: int = 0, ids: SpecialIds | None = None):
        super().__init__(extra_ids=extra_ids)
        self.path = path
        self.ids = ids
        self._model: LoadedModel | None = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_model"] = None  # read again where it is used (a Beam worker, a gin deep copy)
        return state

    def model(self) -> LoadedModel:
        """The processor and serialized model, read on first use."""
        if self._model is None:
            with _load_lock:
                if self._model is None:
                    self._model = load_model(self.path, self._extra_ids)
        return self._model

    @property
    def tokenizer(self) -> sentencepiece.SentencePieceProcessor:
        return self.model().tokenizer

    @property
    def sp_model(self) -> bytes:
        return self.model().sp_model

    @property
    def sentencepiece_model_file(self) -> str:
        return self.path

    @property
    def files(self) -> list[str]:
        """The model file (what a run copies into MODEL_DIR/hf/ for a Hugging Face tokenizer)."""
        return [self.path]

    @property
    def bos_id(self) -> int | None:
        return self.tokenizer.bos_id() if self.ids is None else self.ids.bos

    @property
    def eos_id(self) -> int | None:
        return self.tokenizer.eos_id() if self.ids is None else self.ids.eos

    @property
    def unk_id(self) -> int | None:
        return self.tokenizer.unk_id() if self.ids is None else self.ids.unk

    @property
    def decoder_start_id(self) -> int:
        """A decoder-only model's first input: BOS (else EOS) of a Hugging Face tokenizer; seqio's 0."""
        return 0 if self.ids is None else self.ids.decoder_start

    @property
    def zero_is_token(self) -> bool:
        """Whether id 0 is a real token (never, with seqio's ids: it is the padding)."""
        return False if self.ids is None else self.ids.zero_is_token

    @property
    def _base_vocab_size(self) -> int:
        return self.tokenizer.GetPieceSize()

    @property
    def vocab_size(self) -> int:
        """The model's pieces, the sentinels appended to it included."""
        return self._base_vocab_size

    def _encode(self, s: str) -> list[int]:
        return self.tokenizer.EncodeAsIds(s)

    def _decode(self, ids: list[int]) -> str:
        unk, size = self.tokenizer.unk_id(), self.tokenizer.GetPieceSize()
        return self.tokenizer.DecodeIds([unk if i >= size else int(i) for i in ids])

    def __eq__(self, other):
        return (isinstance(other, SentencePieceVocabulary)
                and (self.path, self._extra_ids, self.ids) == (other.path, other._extra_ids, other.ids))

    def __hash__(self):
        return hash((self.path, self._extra_ids, self.ids))

    def __str__(self) -> str:
        ids = "seqio's ids" if self.ids is None else str(self.ids)
        return f"SentencePieceVocabulary(file={self.path}, extra_ids={self._extra_ids}, {ids})"
