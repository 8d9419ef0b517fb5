"""Encoder-decoder transformer, T5 v1.1.

Pre-norm RMSNorm blocks without biases, gated-GELU MLPs, relative position biases (bucketed,
one table per stack shared by its layers), no 1/sqrt(d) at run time (folded into the query
initialisation), a token embedding shared by encoder and decoder, and untied output logits
unless `tie_embeddings`. Read top to bottom: config, the two blocks, the two stacks, the model.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from t5x_lite.models import layers, masks, stack
from t5x_lite.models import encoder_decoder_generation as generation
from t5x_lite.models.base import BaseModel
from t5x_lite.models.decoder_only import LOGITS_INIT

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class T5Config(BaseModel):
    """Sizes and switches of a T5 v1.1 encoder-decoder (bound in gin/models/t5_*.gin).

    Attributes:
      vocab_size: rows of the shared embedding table (SentencePiece pieces + sentinel ids).
      emb_dim: width of the residual stream.
      num_heads: attention heads.
      head_dim: width of each head.
      mlp_dim: hidden width of the MLP.
      num_encoder_layers: encoder blocks.
      num_decoder_layers: decoder blocks.
      dropout_rate: dropout on embeddings, after attention and MLP, and on stack outputs.
      dtype: compute dtype ('float32' or 'bfloat16'); parameters are always float32.
      scan_layers: stack blocks with scan_with_axes (fast compile) or unroll them.
      scan_unroll: scanned layers only: layers per iteration of the compiled loop; num_layers
        or more compiles straight-line code over the stacked parameters (faster for shallow
        models, compile time grows with depth; the checkpoint layout is the same). 'auto': the
        train loop chooses at start-up: no loop on a GPU where the step without it fits the
        device and no mesh axis shards the parameters, else the loop (parallel/layer_layout.py).
      remat_policy: activation rematerialisation, one of stack.REMAT_POLICIES.
      mlp_activations: ('gelu', 'linear') is T5 v1.1's gated GELU; ('relu',) is original T5's.
      tie_embeddings: logits from the shared embedding (scaled by 1/sqrt(emb_dim), as in T5 1.0)
        instead of a separate output projection (T5 v1.1).
      relative_attention_num_buckets: buckets of the relative position bias.
      relative_attention_max_distance: distances beyond this share the last bucket.
      norm_epsilon: added to the variance in every RMSNorm; None is 1e-6 (T5's value).
    """

    vocab_size: int = 32128
    emb_dim: int = 512
    num_heads: int = 6
    head_dim: int = 64
    mlp_dim: int = 1024
    num_encoder_layers: int = 8
    num_decoder_layers: int = 8
    dropout_rate: float = 0.0
    dtype: str = "float32"
    scan_layers: bool = True
    scan_unroll: int | str = 1
    remat_policy: str = "none"
    mlp_activations: tuple[str, ...] = ("gelu", "linear")
    tie_embeddings: bool = False
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    norm_epsilon: float | None = None

    family = "encoder_decoder"
    feature_converters = ("enc_dec",)
    decoding_methods = ("greedy", "sample", "beam")
    hf_model_types = ("t5",)

    def __post_init__(self):
        self._check_common()

    def make_module(self) -> nn.Module:
        return EncoderDecoder(self)

    def attention(self, platform: str | None = None) -> str:
        """The attention implementation this config runs on `platform` (default: JAX's backend): never
        cuDNN's fused kernel, whose backward pass gives no gradient for the relative position bias."""
        return layers.attention_implementation("auto", self.compute_dtype, self.head_dim, allow_fused=False,
                                               platform=platform)

    def num_embedding_params(self) -> int:
        return self.vocab_size * self.emb_dim

    def _sizes(self) -> dict[str, int]:
        d, hd, h, m = self.emb_dim, self.head_dim, self.num_heads, self.mlp_dim
        return {"attention": 4 * d * h * hd, "mlp": len(self.mlp_activations) * d * m + m * d,
                "relpos": h * self.relative_attention_num_buckets}

    def num_params(self) -> int:
        """Parameter count from the sizes alone (checked against the real tree in tests)."""
        s, d = self._sizes(), self.emb_dim
        encoder = s["relpos"] + self.num_encoder_layers * (s["attention"] + s["mlp"] + 2 * d) + d
        decoder = s["relpos"] + self.num_decoder_layers * (2 * s["attention"] + s["mlp"] + 3 * d) + d
        logits = 0 if self.tie_embeddings else self.vocab_size * d
        return self.num_embedding_params() + encoder + decoder + logits

    def train_flops_per_token(self, *, targets_length: int, inputs_length: int | None = None) -> float:
        return self.flops_per_token(targets_length, inputs_length=inputs_length)

    def init_inputs(self, rows: int = 1, length: int = 8, inputs_length: int | None = None) -> dict[str, Any]:
        return {**super().init_inputs(rows, length),
                "encoder_input_tokens": jax.ShapeDtypeStruct((rows, inputs_length or length), np.int32)}

    def activation_stacks(self, *, rows: int, length: int, inputs_length: int | None) -> list[dict[str, float]]:
        inputs = inputs_length or length
        q, heads = self.num_heads * self.head_dim, self.num_heads
        mlp = dict(width=self.emb_dim, mlp=self.mlp_dim, n_mlp_in=len(self.mlp_activations))
        # Decoder layers: self- and cross-attention, the cross-attention's keys and values over the inputs.
        return [dict(num_layers=self.num_encoder_layers, tokens=rows * inputs, q=q, kv=2 * q, scores=heads * inputs,
                     **mlp),
                dict(num_layers=self.num_decoder_layers, tokens=rows * length, q=2 * q,
                     kv=2 * q + 2 * q * inputs / length, attention_blocks=2, scores=heads * (length + inputs), **mlp)]

    def decode_call(self, rows, *, method, max_new_tokens, sampling, rng, eos_id, bos_id, use_cache=True,
                    beam_size=4, alpha=0.6):
        del bos_id  # the decoder starts from 0
        return generation.decode_call(self, rows, method=method, max_new_tokens=max_new_tokens, sampling=sampling,
                                      rng=rng, eos_id=eos_id, use_cache=use_cache, beam_size=beam_size, alpha=alpha)

    def score_call(self, pairs, *, bos_id):
        del bos_id
        return generation.score_call(self, pairs)

    def flops_per_token(self, seq_len: int, inputs_length: int | None = None) -> float:
        """Training FLOPs per *target* token, the encoder's work on the inputs included.

        6 FLOPs per matmul parameter per token it touches, plus 12 * heads * head_dim per
        attended position (forward QK^T and AV, times three for the backward pass).
        """
        inputs_length = seq_len if inputs_length is None else inputs_length
        d, hd, h = self.emb_dim, self.head_dim, self.num_heads
        s = self._sizes()
        attend = 12 * h * hd
        cross_kv = 2 * d * h * hd  # cross-attention k and v projections run on encoder tokens
        per_input = (6 * (self.num_encoder_layers * (s["attention"] + s["mlp"]) + self.num_decoder_layers * cross_kv)
                     + self.num_encoder_layers * attend * inputs_length)
        per_target = (6 * (self.num_decoder_layers * (2 * s["attention"] - cross_kv + s["mlp"]) + self.vocab_size * d)
                      + self.num_decoder_layers * attend * (seq_len + inputs_length))
        return per_target + per_input * inputs_length / seq_len


def _norm(cfg: T5Config):
    return layers.norm_class("rmsnorm", cfg.norm_epsilon)


def _attention(cfg: T5Config, name: str, kv_cache: str = "none") -> layers.Attention:
    return layers.Attention(cfg.num_heads, cfg.num_heads, cfg.head_dim, cfg.compute_dtype, use_rope=False,
                            fold_scale_into_query=True, kv_cache=kv_cache, implementation=cfg.attention(), name=name)


class EncoderBlock(nn.Module):
    """x + SelfAttn(norm(x), relative bias); x + MLP(norm(x)). Returns (x, None) for scan."""

    config: T5Config
    deterministic: bool

    @nn.compact
    def __call__(self, x: Array, mask: Array, bias: Array):
        cfg, dtype = self.config, self.config.compute_dtype
        dropout = lambda h: nn.Dropout(cfg.dropout_rate)(h, deterministic=self.deterministic)  # noqa: E731
        x = layers.with_logical_constraint(x, ("batch", "length", "embed"))
        h = _norm(cfg)(dtype=dtype, name="attn_norm")(x)
        x = x + dropout(_attention(cfg, "attention")(h, h, mask, bias=bias))
        h = _norm(cfg)(dtype=dtype, name="mlp_norm")(x)
        x = x + dropout(layers.MLP(cfg.mlp_dim, cfg.mlp_activations, dtype, name="mlp")(h))
        return layers.with_logical_constraint(x, ("batch", "length", "embed")), None


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention to the encoder, MLP; each pre-norm and residual.

    `decode=True`: the self-attention appends to a KV cache; the cross-attention caches the k/v
    of `encoded` when given it and reuses them when `encoded` is None.
    """

    config: T5Config
    deterministic: bool
    decode: bool = False

    @nn.compact
    def __call__(self, y: Array, encoded: Array | None, self_mask: Array | None, cross_mask: Array, bias: Array):
        cfg, dtype = self.config, self.config.compute_dtype
        dropout = lambda h: nn.Dropout(cfg.dropout_rate)(h, deterministic=self.deterministic)  # noqa: E731
        self_cache, cross_cache = ("append", "fixed") if self.decode else ("none", "none")
        y = layers.with_logical_constraint(y, ("batch", "length", "embed"))
        h = _norm(cfg)(dtype=dtype, name="attn_norm")(y)
        y = y + dropout(_attention(cfg, "attention", self_cache)(h, h, self_mask, bias=bias))
        h = _norm(cfg)(dtype=dtype, name="cross_attn_norm")(y)
        y = y + dropout(_attention(cfg, "cross_attention", cross_cache)(h, encoded, cross_mask))
        h = _norm(cfg)(dtype=dtype, name="mlp_norm")(y)
        y = y + dropout(layers.MLP(cfg.mlp_dim, cfg.mlp_activations, dtype, name="mlp")(h))
        return layers.with_logical_constraint(y, ("batch", "length", "embed")), None


def _relative_bias(cfg: T5Config, length: int, *, bidirectional: bool) -> Array:
    return layers.RelativePositionBias(
        cfg.num_heads, cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance,
        bidirectional=bidirectional, dtype=cfg.compute_dtype, name="relpos_bias")(length, length)


class Encoder(nn.Module):
    """Input ids -> encoded [batch, length, embed]."""

    config: T5Config
    embed: nn.Module

    @nn.compact
    def __call__(self, tokens: Array, segment_ids: Array, deterministic: bool) -> Array:
        cfg = self.config
        dropout = lambda h: nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)  # noqa: E731
        x = dropout(self.embed(tokens))
        bias = _relative_bias(cfg, tokens.shape[-1], bidirectional=True)
        mask = masks.make_bidirectional_mask(segment_ids, segment_ids)
        blocks = stack.stack_layers(EncoderBlock, num_layers=cfg.num_encoder_layers, scan=cfg.scan_layers,
                                    unroll=cfg.layers_per_iteration, remat=cfg.remat_policy, num_broadcast=2)
        x, _ = blocks(cfg, deterministic)(x, mask, bias)
        return dropout(_norm(cfg)(dtype=cfg.compute_dtype, name="final_norm")(x))


class Decoder(nn.Module):
    """Target ids (shifted right) + encoded inputs -> float32 logits [batch, length, vocab].

    `decode=True` runs on a KV cache (see EncoderDecoder.decode): causality comes from the
    cache, and the relative bias spans all `max_decode_length` cache slots, from which each
    attention layer takes the rows of its new tokens at its cache index.
    """

    config: T5Config
    embed: nn.Module

    @nn.compact
    def __call__(self, tokens: Array, encoded: Array | None, segment_ids: Array, encoder_segment_ids: Array,
                 deterministic: bool, decode: bool = False, max_decode_length: int | None = None) -> Array:
        cfg = self.config
        dropout = lambda h: nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)  # noqa: E731
        y = dropout(self.embed(tokens))
        if decode:
            if max_decode_length is None:
                raise ValueError("decode=True needs max_decode_length, the length of the KV cache.")
            self_mask, length = None, max_decode_length
        else:
            self_mask, length = masks.make_attention_mask(segment_ids), tokens.shape[-1]
        bias = _relative_bias(cfg, length, bidirectional=False)
        cross_mask = masks.make_bidirectional_mask(segment_ids, encoder_segment_ids)
        blocks = stack.stack_layers(DecoderBlock, num_layers=cfg.num_decoder_layers, scan=cfg.scan_layers,
                                    unroll=cfg.layers_per_iteration, remat=cfg.remat_policy, num_broadcast=4)
        y, _ = blocks(cfg, deterministic, decode)(y, encoded, self_mask, cross_mask, bias)
        y = dropout(_norm(cfg)(dtype=cfg.compute_dtype, name="final_norm")(y))
        if cfg.tie_embeddings:
            logits = self.embed.attend(y) / math.sqrt(cfg.emb_dim)
        else:
            logits = layers.Dense((cfg.vocab_size,), ("embed", "vocab"), cfg.compute_dtype,
                                  kernel_init=LOGITS_INIT, keep_cast_kernel=True, name="logits")(y)
        return layers.with_logical_constraint(logits.astype(jnp.float32), ("batch", "length", "vocab"))


def _segments(tokens: Array, segment_ids: Array | None) -> Array:
    """Segment ids with padding (token 0) as segment 0; all real tokens in segment 1 if unpacked."""
    if segment_ids is not None:
        return segment_ids
    return (tokens > 0).astype(jnp.int32)


class EncoderDecoder(nn.Module):
    """T5: (inputs, shifted targets) -> logits. Arguments carry seqio's feature names.

    Positions are not needed: relative position biases depend only on index differences,
    which packing leaves unchanged inside a segment.
    """

    config: T5Config

    def setup(self):
        cfg = self.config
        self.token_embed = layers.Embed(cfg.vocab_size, cfg.emb_dim, cfg.compute_dtype)
        self.encoder = Encoder(cfg, self.token_embed)
        self.decoder = Decoder(cfg, self.token_embed)

    def encode(self, encoder_input_tokens: Array, encoder_segment_ids: Array | None = None,
               deterministic: bool = True) -> Array:
        segments = _segments(encoder_input_tokens, encoder_segment_ids)
        return self.encoder(encoder_input_tokens, segments, deterministic)

    def decode(self, encoded: Array | None, encoder_input_tokens: Array, decoder_input_tokens: Array,
               encoder_segment_ids: Array | None = None, decoder_segment_ids: Array | None = None,
               deterministic: bool = True, decode: bool = False, max_decode_length: int | None = None) -> Array:
        """Decoder logits. With `decode=True` (a mutable 'cache' collection) the decoder tokens are the
        new ones only, starting at the cache index, in a cache of `max_decode_length` slots; the
        cross-attention k/v are computed from `encoded` once and reused by calls with `encoded=None`.
        `init` with `decode=True` sizes the cache from the decoder tokens' length."""
        encoder_segments = _segments(encoder_input_tokens, encoder_segment_ids)
        # The decoder's inputs start with BOS = 0, so its padding cannot be read off the tokens;
        # causality keeps trailing padding from affecting real positions.
        segments = jnp.ones_like(decoder_input_tokens) if decoder_segment_ids is None else decoder_segment_ids
        return self.decoder(decoder_input_tokens, encoded, segments, encoder_segments, deterministic, decode,
                            max_decode_length)

    def __call__(
        self,
        encoder_input_tokens: Array,
        decoder_input_tokens: Array,
        encoder_segment_ids: Array | None = None,
        decoder_segment_ids: Array | None = None,
        encoder_positions: Array | None = None,
        decoder_positions: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        del encoder_positions, decoder_positions  # relative biases need no absolute positions
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, deterministic)
        return self.decode(encoded, encoder_input_tokens, decoder_input_tokens, encoder_segment_ids,
                           decoder_segment_ids, deterministic)
