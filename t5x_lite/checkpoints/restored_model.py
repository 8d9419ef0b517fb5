"""A trained model read back for evaluation and inference: its config, params and vocabulary.

Everything comes from the model directory (the checkpoint's metadata gives the model's sizes,
vocab/spm.model the vocabulary, or hf/ the Hugging Face tokenizer of a converted model or of a run
trained on one), so no model gin file is needed. A model config that is given anyway must match the checkpoint, or the
run stops naming the fields that differ.

The params are read straight into their shardings on a `Placement` (the training rule tables
on a mesh of every device of the run), so a model that needed FSDP to train is never gathered
onto one device.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from t5x_lite import storage
from t5x_lite.checkpoints import checkpoint, lookup
from t5x_lite.data.vocab import hf_vocabulary
from t5x_lite.data.vocab.base import Vocabulary
from t5x_lite.data.vocab.sentencepiece_vocabulary import SentencePieceVocabulary
from t5x_lite.errors import TaskDataError
from t5x_lite.models import BaseModel
from t5x_lite.parallel.placement import Placement


def run_vocabulary(model_dir: str) -> Vocabulary | None:
    """The vocabulary a run reads text with: the Hugging Face tokenizer in MODEL_DIR/hf/ when it is
    the model's, else MODEL_DIR/vocab/spm.model; None when it has neither."""
    vocabulary = hf_vocabulary.model_dir_vocabulary(model_dir)
    spm = storage.join(model_dir, "vocab", "spm.model")
    if vocabulary is None and storage.exists(spm):
        vocabulary = SentencePieceVocabulary(spm)
    return vocabulary


@dataclasses.dataclass(frozen=True)
class RestoredModel:
    """A checkpoint's model config and its float32 params, sharded as `placement` says."""

    config: BaseModel
    params: Any
    step: int
    model_dir: str
    placement: Placement

    @property
    def vocabulary_file(self) -> str:
        return storage.join(self.model_dir, "vocab", "spm.model")

    def vocabulary(self) -> Vocabulary:
        """The vocabulary text is tokenized with: the Hugging Face tokenizer in MODEL_DIR/hf/ when it is
        the model's (a from-hf conversion, or a run trained on such a tokenizer; its own special ids,
        docs/interop.md), else the run's SentencePiece model (MODEL_DIR/vocab/spm.model, seqio's ids).
        Neither needs TensorFlow or seqio (`seqio_vocabularies.as_seqio` makes a seqio one of it)."""
        vocabulary = run_vocabulary(self.model_dir)
        if vocabulary is not None:
            return vocabulary
        raise TaskDataError(f"{self.model_dir} has no vocab/spm.model (the run's task does not use a SentencePiece "
                            "vocabulary) and no Hugging Face tokenizer in hf/ (tokenizer.json or tokenizer.model), "
                            "so text cannot be tokenized for it; use a seqio task whose features carry the "
                            "vocabulary instead.")


def restore(path: str, *, step: int | None = None, expected: BaseModel | None = None,
            mesh_axes: Any = None, rules: Any = None, local: bool = False) -> RestoredModel:
    """Reads the params of `path` (a model directory: its latest step unless `step`; or a step directory).

    `expected`, when given, must describe the same model as the checkpoint
    (CheckpointMismatchError otherwise); by default the checkpoint's own config is used.
    `mesh_axes` and `rules` (a gin/mesh file's MESH_AXES and LOGICAL_AXIS_RULES) place the
    params; None chooses the mesh from the model's size (placement.choose_mesh_axes). The mesh
    spans every device of the run, or with `local` this process's devices alone (each process
    then runs on its own, as infer's shards do).
    """

    model_dir, step = lookup.locate(path, step)
    checkpoints = checkpoint.Checkpointer(model_dir, read_only=True)
    try:
        metadata = checkpoints.metadata(step)
        if expected is not None:
            checkpoint.check_compatible(metadata, expected.metadata(), model_dir=model_dir)
        config = expected or BaseModel.from_metadata(metadata["family"], metadata["model"])
        placement = Placement.build(mesh_axes=mesh_axes, rules=rules, model=config, local=local)
        params = checkpoints.restore_params(step, shardings=placement.params_shardings(config))
    finally:
        checkpoints.close()
    return RestoredModel(config=config, params=params, step=step, model_dir=model_dir, placement=placement)
