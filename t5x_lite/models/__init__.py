"""Models: Flax linen model families, their building blocks and their losses.

Owns:
  decoder_only.py        `DecoderConfig` and `Decoder`: the LLaMA-style or GPT-2-style LM, with the
                         options of Mistral (sliding window), Qwen2 (q/k/v biases) and Gemma
  encoder_decoder.py     `T5Config` and `EncoderDecoder`: T5 v1.1
  base.py                `BaseModel`: the interface every family implements (module, init inputs, loss
                         sums, FLOPs, converters, prompt rule, decode and score calls, HF types) and
                         the family registry `FAMILIES`; the config validation both families share
  generation.py          what every family's generation shares: token choice, the sampling loop,
                         `DecodeCall` (one batch's host arrays and its jitted program)
  decoder_only_generation.py     the decoder-only LM's generation and scoring programs
  encoder_decoder_generation.py  T5's greedy/sampled generation, beam search and scoring programs
  layers.py              RoPE, relative position buckets, norms, `Embed`, `Dense`, attention, MLP;
                         every parameter named by logical axes
  masks.py               attention masks: causal, packed segments, prefix LM, sliding windows
  explicit_attention.py  softmax attention with a written-out backward pass ('explicit', CPU)
  packed_attention.py    causal attention over packed rows on cuDNN's packed layout (segment
                         offsets and lengths instead of a dense mask)
  projection.py          every dense layer's dot, with a written-out backward pass
  stack.py               layer stacking (`scan_with_axes` or a loop) and remat policies by name
  losses.py              cross entropy with z-loss and label smoothing, as sums plus token counts
  activation_memory.py   bytes a layer stack saves for the backward pass by remat policy and attention,
                         and the logits' (pure arithmetic: the estimate and the layer-layout choice)

Each family is a config dataclass on `base.BaseModel`; the rest of the package calls only that
interface and never asks which family a model is. A new family is one module here (its config
class with a `family` name, which registers it, and its Flax module), its gin file and, if it
converts, its Hugging Face rules (hf/).
Public names: `BaseModel`, `FAMILIES` (family name -> class), `DecoderConfig`, `T5Config`,
`stack.check_backend_supports`, `losses.weighted_loss_sums`, `losses.cross_entropy_with_logits`.

May import: `t5x_lite.errors` and `t5x_lite.tf_setup` only. Models name logical axes and never
import data, training, checkpoints, config, evaluation, inference, parallel, metrics or storage
(pyproject.toml's layers contract and its "Models know nothing" contract).
"""

from __future__ import annotations

from t5x_lite.models.base import FAMILIES, BaseModel
from t5x_lite.models.decoder_only import DecoderConfig
from t5x_lite.models.encoder_decoder import T5Config

__all__ = ["FAMILIES", "BaseModel", "DecoderConfig", "T5Config"]
