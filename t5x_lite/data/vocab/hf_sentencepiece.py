"""A Hugging Face SentencePiece `tokenizer.model` (LLaMA, Mistral, Gemma, T5) as a seqio vocabulary
that keeps the model's own special ids.

seqio's `SentencePieceVocabulary` already reads the model's EOS, UNK and BOS from the file and
encodes without BOS or EOS (Python: `EncodeAsIds`; TensorFlow: tensorflow_text's op), so this
subclass keeps its encoding and changes what assumes seqio's ids (pad 0, eos 1, unk 2): it
loads the model without seqio's warning that pad is not 0 (LLaMA has no pad; its id 0 is
<unk>), takes the special ids from the model folder's JSON files (`tokenizer_files`), and
`decode_tf` blanks what follows EOS with EOS rather than with id 0 (which for LLaMA decodes to
" ⁇ "). The model is read through `storage`, so a local, gs:// or s3:// path works alike.
"""

from __future__ import annotations

import dataclasses
import threading

import sentencepiece
from sentencepiece import sentencepiece_model_pb2

from t5x_lite import storage
from t5x_lite.data.vocab.tokenizer_files import SpecialIdProperties, SpecialIds, TokenizerError
from t5x_lite.tf_setup import import_tensorflow

tf = import_tensorflow()  # first, so that seqio finds it quiet and off the GPUs

import seqio  # noqa: E402

_load_lock = threading.Lock()  # SentencePiece's proto loading is not thread-safe (seqio's note)


@dataclasses.dataclass(frozen=True)
class _Loaded:
    """What seqio's SentencePieceVocabulary reads from its model context."""

    tokenizer: sentencepiece.SentencePieceProcessor
    sp_model: bytes


def read_model(path: str) -> bytes:
    """The serialized SentencePiece model at `path`; TokenizerError when it is not one."""
    with storage.open(path, "rb") as f:
        model = f.read()
    try:
        sentencepiece.SentencePieceProcessor(model_proto=model)
    except (RuntimeError, TypeError) as e:
        raise TokenizerError(f"{path} is not a SentencePiece model ({e}). Name the tokenizer.model of a Hugging "
                             "Face model folder, or its tokenizer.json.") from None
    return model


def own_ids(model: bytes) -> SpecialIds:
    """The special ids a serialized SentencePiece model declares itself (-1: none)."""
    processor = sentencepiece.SentencePieceProcessor(model_proto=model)
    ids = {name: getattr(processor, f"{name}_id")() for name in ("bos", "eos", "pad", "unk")}
    return SpecialIds(**{name: value if value >= 0 else None for name, value in ids.items()})


class HfSentencePieceVocabulary(SpecialIdProperties, seqio.SentencePieceVocabulary):
    """A SentencePiece model with the special ids of its Hugging Face folder.

    `decoder_start_id` is BOS (else EOS); `zero_is_token` says id 0 is a real token (LLaMA's
    <unk>) unless it is the padding (Gemma's and T5's <pad>). `extra_ids` adds sentinels as
    seqio does (T5's <extra_id_N>, highest first).
    """

    def __init__(self, path: str, *, ids: SpecialIds, extra_ids: int = 0):
        self.ids = ids
        super().__init__(path, extra_ids=extra_ids)

    def _model_context(self) -> _Loaded:
        if self._model is None:
            with _load_lock:
                if self._model is None:
                    self._model = _load(self._sentencepiece_model_file, self._extra_ids)
        return self._model

    @property
    def files(self) -> list[str]:
        """The model file (what a run copies into MODEL_DIR/hf/)."""
        return [self.sentencepiece_model_file]

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

    def __eq__(self, other):
        return isinstance(other, HfSentencePieceVocabulary) and self.ids == other.ids and super().__eq__(other)

    def __hash__(self):
        return hash((self.sentencepiece_model_file, self.ids, self._extra_ids))

    def __str__(self) -> str:
        return f"HfSentencePieceVocabulary(file={self.sentencepiece_model_file}, extra_ids={self._extra_ids}, {self.ids})"


def _load(path: str, extra_ids: int) -> _Loaded:
    """The model with `extra_ids` sentinel pieces appended, highest id first (seqio's and T5's order)."""
    model = read_model(path)
    if extra_ids:
        proto = sentencepiece_model_pb2.ModelProto.FromString(model)
        for i in reversed(range(extra_ids)):
            proto.pieces.add(piece=f"▁<extra_id_{i}>", score=0.0,
                             type=sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED)
        model = proto.SerializeToString()
    return _Loaded(tokenizer=sentencepiece.SentencePieceProcessor(model_proto=model), sp_model=model)
