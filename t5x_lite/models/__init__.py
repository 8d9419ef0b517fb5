"""Flax linen model families and their losses.

Each family's config dataclass (`DecoderConfig`, `T5Config`) has a `family` name, builds its
module with `make_module()`, and counts its parameters and training FLOPs.
"""

from __future__ import annotations

from typing import Any, Union

from t5x_lite.models.decoder_only import DecoderConfig
from t5x_lite.models.encoder_decoder import T5Config

ModelConfig = Union[DecoderConfig, T5Config]
CONFIG_CLASSES = {cls.family: cls for cls in (DecoderConfig, T5Config)}


def train_flops_per_token(model: ModelConfig, *, targets_length: int, inputs_length: int | None = None) -> float:
    """Training FLOPs per target token, as MFU counts them (for T5 the encoder's share included)."""
    if model.family == "encoder_decoder":
        return model.flops_per_token(targets_length, inputs_length=inputs_length)
    return model.flops_per_token(targets_length)


def config_from_dict(family: str, values: dict[str, Any]) -> ModelConfig:
    """Rebuilds a model config from checkpoint metadata ({'family': ..., 'model': {...}})."""
    if family not in CONFIG_CLASSES:
        raise ValueError(f"Unknown model family {family!r}; known: {list(CONFIG_CLASSES)}.")
    return CONFIG_CLASSES[family](**values)
