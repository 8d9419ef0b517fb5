"""Models: Flax linen model families, their building blocks and their losses.

Owns:
  decoder_only.py        `DecoderConfig` and `Decoder`: the LLaMA-style or GPT-2-style LM, with the
                         options of Mistral (sliding window), Qwen2 (q/k/v biases) and Gemma
  encoder_decoder.py     `T5Config` and `EncoderDecoder`: T5 v1.1
  config_base.py         what both config dataclasses share: dtype, validation helpers, a dict form
  layers.py              RoPE, relative position buckets, norms, `Embed`, `Dense`, attention, MLP;
                         every parameter named by logical axes
  masks.py               attention masks: causal, packed segments, prefix LM, sliding windows
  explicit_attention.py  softmax attention with a written-out backward pass ('explicit', CPU)
  packed_attention.py    causal attention over packed rows on cuDNN's packed layout (segment
                         offsets and lengths instead of a dense mask)
  projection.py          every dense layer's dot, with a written-out backward pass
  stack.py               layer stacking (`scan_with_axes` or a loop) and remat policies by name
  losses.py              cross entropy with z-loss and label smoothing, as sums plus token counts

Each family's config dataclass has a `family` name, builds its module with `make_module()`,
names the attention it runs (`attention()`) and counts its parameters and training FLOPs.
Public names (defined here): `ModelConfig`, `CONFIG_CLASSES`, `train_flops_per_token`,
`config_from_dict`; and `DecoderConfig`, `T5Config`,
`stack.check_backend_supports`, `losses.weighted_loss_sums`, `losses.cross_entropy_with_logits`.

May import: `t5x_lite.errors` and `t5x_lite.tf_setup` only. Models name logical axes and never
import data, training, checkpoints, config, evaluation, inference, parallel, metrics or storage
(pyproject.toml's layers contract and its "Models know nothing" contract).
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
