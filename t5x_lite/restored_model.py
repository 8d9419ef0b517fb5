"""A trained model read back for evaluation and inference: its config, params and vocabulary.

Everything comes from the model directory (the checkpoint's metadata gives the model's sizes,
vocab/spm.model the vocabulary), so no model gin file is needed. A model config that is given
anyway must match the checkpoint, or the run stops naming the fields that differ.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from t5x_lite import storage
from t5x_lite.models import ModelConfig, config_from_dict


@dataclasses.dataclass(frozen=True)
class RestoredModel:
    """A checkpoint's model config and float32 params (on this process's first device)."""

    config: ModelConfig
    params: Any
    step: int
    model_dir: str

    @property
    def vocabulary_file(self) -> str:
        return storage.join(self.model_dir, "vocab", "spm.model")

    def vocabulary(self):
        """The run's SentencePiece vocabulary (MODEL_DIR/vocab/spm.model), for text prompts."""
        from t5x_lite.errors import TaskDataError

        if not storage.exists(self.vocabulary_file):
            raise TaskDataError(f"{self.model_dir} has no vocab/spm.model (the run's task does not use a "
                                "SentencePiece vocabulary), so text cannot be tokenized for it; use a seqio task "
                                "whose features carry the vocabulary instead.")
        import seqio

        return seqio.SentencePieceVocabulary(storage.tensorflow_readable(self.vocabulary_file))


def restore(path: str, *, step: int | None = None, expected: ModelConfig | None = None) -> RestoredModel:
    """Reads the params of `path` (a model directory: its latest step unless `step`; or a step directory).

    `expected`, when given, must describe the same model as the checkpoint
    (CheckpointMismatchError otherwise); by default the checkpoint's own config is used.
    """
    from t5x_lite import checkpoint

    model_dir, step = checkpoint.locate(path, step)
    checkpoints = checkpoint.Checkpointer(model_dir, create=False)
    try:
        metadata = checkpoints.metadata(step)
        if expected is not None:
            current = {"family": expected.family, "model": json.loads(json.dumps(expected.to_dict()))}
            checkpoint.check_compatible(metadata, current, model_dir=model_dir)
        params = checkpoints.restore_params(step)
    finally:
        checkpoints.close()
    config = expected or config_from_dict(metadata["family"], metadata["model"])
    return RestoredModel(config=config, params=params, step=step, model_dir=model_dir)
