"""Decoder-only language model (LLaMA style: pre-norm RMSNorm, RoPE, SwiGLU, grouped-query attention).

Read top to bottom: config, one block, the stack, the model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from t5x_lite.models import layers, stack

Array = jax.Array
LOGITS_INIT = nn.initializers.variance_scaling(0.01, "fan_in", "truncated_normal")


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Sizes and switches of a decoder-only LM (bound in gin/models/*.gin).

    Attributes:
      vocab_size: rows of the embedding table; at least the vocabulary's size.
      emb_dim: width of the residual stream.
      num_heads: query heads.
      num_kv_heads: key/value heads (grouped-query attention); divides num_heads.
      head_dim: width of each head.
      mlp_dim: hidden width of the SwiGLU MLP.
      num_layers: number of transformer blocks.
      max_len: longest sequence the model is configured for (training and decoding).
      dropout_rate: dropout after attention and MLP; 0 disables it.
      dtype: compute dtype ('float32' or 'bfloat16'); parameters are always float32.
      scan_layers: stack blocks with scan_with_axes (fast compile) or unroll them.
      remat_policy: activation rematerialisation, one of stack.REMAT_POLICIES.
      rope_max_wavelength: RoPE base.
    """

    vocab_size: int = 4096
    emb_dim: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    mlp_dim: int = 512
    num_layers: int = 2
    max_len: int = 256
    dropout_rate: float = 0.0
    dtype: str = "float32"
    scan_layers: bool = True
    remat_policy: str = "none"
    rope_max_wavelength: float = 10_000.0

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}."
            )
        stack.remat_policy(self.remat_policy)  # fails early on an unknown name

    @property
    def compute_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def num_params(self) -> int:
        """Parameter count from the sizes alone (checked against the real tree in tests)."""
        d, h, kv, hd, m, v = (self.emb_dim, self.num_heads, self.num_kv_heads,
                              self.head_dim, self.mlp_dim, self.vocab_size)
        attention = d * hd * (2 * h + 2 * kv)
        block = attention + 3 * d * m + 2 * d
        return 2 * v * d + self.num_layers * block + d

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 x (non-embedding-lookup params) + attention scores.

        The attention term is 12 * layers * heads * head_dim * seq_len (forward QK^T and AV,
        times three for the backward pass), as in the PaLM appendix.
        """
        matmul_params = self.num_params() - self.vocab_size * self.emb_dim
        attention = 12 * self.num_layers * self.num_heads * self.head_dim * seq_len
        return 6.0 * matmul_params + attention


class DecoderBlock(nn.Module):
    """Pre-norm block: x + Attn(norm(x)); x + MLP(norm(x)). Returns (x, None) for scan."""

    config: DecoderConfig
    deterministic: bool

    @nn.compact
    def __call__(self, x: Array, mask: Array, positions: Array):
        cfg = self.config
        dtype = cfg.compute_dtype
        x = layers.with_logical_constraint(x, ("batch", "length", "embed"))
        h = layers.RMSNorm(dtype=dtype, name="attn_norm")(x)
        h = layers.Attention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, dtype,
                             cfg.rope_max_wavelength, name="attention")(h, mask, positions)
        x = x + nn.Dropout(cfg.dropout_rate)(h, deterministic=self.deterministic)
        h = layers.RMSNorm(dtype=dtype, name="mlp_norm")(x)
        h = layers.SwiGLU(cfg.mlp_dim, dtype, name="mlp")(h)
        x = x + nn.Dropout(cfg.dropout_rate)(h, deterministic=self.deterministic)
        return layers.with_logical_constraint(x, ("batch", "length", "embed")), None


class Decoder(nn.Module):
    """The LM: token ids [batch, length] -> float32 logits [batch, length, vocab]."""

    config: DecoderConfig

    @nn.compact
    def __call__(
        self,
        tokens: Array,
        positions: Array | None = None,
        segment_ids: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        cfg = self.config
        if segment_ids is None:
            segment_ids = jnp.ones_like(tokens)
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[-1]), tokens.shape)
        mask = layers.make_attention_mask(segment_ids)

        x = layers.Embed(cfg.vocab_size, cfg.emb_dim, cfg.compute_dtype, name="token_embed")(tokens)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        blocks = stack.stack_layers(DecoderBlock, num_layers=cfg.num_layers,
                                    scan=cfg.scan_layers, remat=cfg.remat_policy)
        x, _ = blocks(cfg, deterministic)(x, mask, positions)
        x = layers.RMSNorm(dtype=cfg.compute_dtype, name="final_norm")(x)
        # A small output init makes the initial loss ~ln(vocab): the step-0 sanity check relies on it.
        logits = layers.Dense((cfg.vocab_size,), ("embed", "vocab"), cfg.compute_dtype,
                              kernel_init=LOGITS_INIT, name="logits")(x)
        return layers.with_logical_constraint(logits.astype(jnp.float32), ("batch", "length", "vocab"))
