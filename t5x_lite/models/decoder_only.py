"""Decoder-only language model, LLaMA style or GPT-2 style, with the options of Mistral, Qwen2 and Gemma.

LLaMA style (the default): RoPE, RMSNorm, SwiGLU, grouped-query attention, untied output.
GPT-2 style (gin/models/gpt2_*.gin): learned positions, LayerNorm, GELU MLP, biases, tied
embeddings. Mistral adds a sliding attention window, Qwen2 biases on q, k and v, Gemma a
gated GELU, RMSNorm scaled by (1 + scale) and embeddings scaled by sqrt(emb_dim)
(gin/models/mistral_*.gin, qwen2_*.gin, gemma_*.gin). All are pre-norm. Read top to bottom:
config, one block, the model.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from t5x_lite.errors import ConfigValueError, RunConfigError
from t5x_lite.models import layers, masks, packed_attention, stack
from t5x_lite.models import decoder_only_generation as generation
from t5x_lite.models.base import BaseModel, check_choice

Array = jax.Array
LOGITS_INIT = nn.initializers.variance_scaling(0.01, "fan_in", "truncated_normal")
POSITION_KINDS = ("rope", "learned")
# GPT-2 initialises its (tied) embeddings and learned positions with this standard deviation.
GPT2_EMBED_STDDEV = 0.02


@dataclasses.dataclass(frozen=True)
class DecoderConfig(BaseModel):
    """Sizes and switches of a decoder-only LM (bound in gin/models/*.gin).

    Attributes:
      vocab_size: rows of the embedding table; at least the vocabulary's size.
      emb_dim: width of the residual stream.
      num_heads: query heads.
      num_kv_heads: key/value heads (grouped-query attention); divides num_heads.
      head_dim: width of each head.
      mlp_dim: hidden width of the MLP.
      num_layers: number of transformer blocks.
      max_len: longest sequence the model is configured for (training and decoding); also
        the size of the learned position table.
      dropout_rate: dropout on the embeddings and after attention and MLP; 0 disables it.
      dtype: compute dtype ('float32' or 'bfloat16'); parameters are always float32.
      scan_layers: stack blocks with scan_with_axes (fast compile) or unroll them.
      scan_unroll: scanned layers only: layers per iteration of the compiled loop; num_layers
        or more compiles straight-line code over the stacked parameters (faster for shallow
        models, compile time grows with depth; the checkpoint layout is the same). 'auto': the
        train loop chooses at start-up: no loop on a GPU where the step without it fits the
        device and no mesh axis shards the parameters, else the loop (parallel/layer_layout.py).
      remat_policy: activation rematerialisation, one of stack.REMAT_POLICIES.
      rope_max_wavelength: RoPE base (position_embedding='rope' only).
      position_embedding: 'rope' (rotary, LLaMA) or 'learned' (a table of max_len rows, GPT-2).
      norm: 'rmsnorm' (LLaMA), 'layernorm' (GPT-2, with bias) or 'rmsnorm_plus_one' (Gemma: RMSNorm
        whose zero-initialised scale multiplies as 1 + scale).
      norm_epsilon: added to the variance in every norm; None is the norm's usual value
        (RMSNorm 1e-6, LayerNorm 1e-5). Converted Hugging Face models carry their own.
      mlp_activations: ('silu', 'linear') is SwiGLU; ('gelu',) is GPT-2's MLP.
      use_bias: biases in every projection (GPT-2).
      tie_embeddings: compute logits with the input embedding table (GPT-2).
      attention_implementation: 'auto' (cuDNN flash attention on GPUs in bfloat16/float16;
        on CPU 'explicit_blas' in float32 on one device where its kernel builds, else 'explicit';
        XLA otherwise), 'xla', 'cudnn', 'explicit' (the XLA math with a written-out backward
        pass, models/explicit_attention.py) or 'explicit_blas' (the same math on the fused
        native CPU kernel, t5x_lite/kernels; float32).
      sliding_window: each position attends only to the last `sliding_window` positions, itself
        included, in training and in cached decoding (Mistral); None: every earlier position.
      cudnn_segments_per_row: with cuDNN attention, packed rows (segment ids) reach the kernel as
        each segment's offset and length (models/packed_attention.py; faster: docs/performance.md,
        GPU section) instead of as a dense mask; the most segments one row may hold, a padding
        tail counting as one. The train loop refuses a batch with a row holding more (check_batch);
        such a row comes out NaN, never wrong. None: the dense mask. No effect on other
        implementations, with a sliding window, or on prefix-LM rows.
      qkv_bias: biases in the query, key and value projections only (Qwen2); `use_bias` puts
        them in every projection.
      scale_embeddings: multiply the token embeddings by sqrt(emb_dim), rounded to the compute
        dtype (Gemma).
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
    scan_unroll: int | str = 1
    remat_policy: str = "none"
    rope_max_wavelength: float = 10_000.0
    position_embedding: str = "rope"
    norm: str = "rmsnorm"
    norm_epsilon: float | None = None
    mlp_activations: tuple[str, ...] = ("silu", "linear")
    use_bias: bool = False
    tie_embeddings: bool = False
    attention_implementation: str = "auto"
    sliding_window: int | None = None
    cudnn_segments_per_row: int | None = None
    qkv_bias: bool = False
    scale_embeddings: bool = False

    family = "decoder_only"
    continues_text = True
    feature_converters = ("lm", "prefix_lm")
    hf_model_types = ("llama", "mistral", "qwen2", "gemma", "gpt2")

    def __post_init__(self):
        self._check_common()
        if self.num_heads % self.num_kv_heads:
            raise ConfigValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}."
            )
        check_choice("position_embedding", self.position_embedding, POSITION_KINDS)
        check_choice("norm", self.norm, tuple(layers.NORMS))
        check_choice("attention_implementation", self.attention_implementation, layers.ATTENTION_IMPLEMENTATIONS)

    def make_module(self) -> nn.Module:
        return Decoder(self)

    def attention(self, platform: str | None = None) -> str:
        """The attention implementation this config runs on `platform` (default: JAX's backend),
        'auto' resolved (layers.attention_implementation)."""
        return layers.attention_implementation(self.attention_implementation, self.compute_dtype, self.head_dim,
                                               platform=platform)

    def packed_layout(self) -> bool:
        """Whether packed causal rows reach cuDNN as segment offsets and lengths (packed_attention.py)
        on this backend, rather than as a dense mask."""
        if self.cudnn_segments_per_row is None or self.sliding_window is not None:
            return False
        return self.attention() == "cudnn"

    def check_batch(self, batch: Any) -> None:
        """On the packed layout, a row holding more segments than cudnn_segments_per_row is refused."""
        segments = batch.get("decoder_segment_ids")
        if segments is not None and "decoder_causal_attention" not in batch and self.packed_layout():
            packed_attention.check_rows(np.asarray(segments), self.cudnn_segments_per_row)

    def num_embedding_params(self) -> int:
        """Parameters of the lookup tables (tokens, and learned positions)."""
        positions = self.max_len * self.emb_dim if self.position_embedding == "learned" else 0
        return self.vocab_size * self.emb_dim + positions

    def num_params(self) -> int:
        """Parameter count from the sizes alone (checked against the real tree in tests)."""
        d, h, kv, hd, m, v = (self.emb_dim, self.num_heads, self.num_kv_heads,
                              self.head_dim, self.mlp_dim, self.vocab_size)
        bias, qkv_bias = int(self.use_bias), int(self.use_bias or self.qkv_bias)
        norm = 2 * d if self.norm == "layernorm" else d
        attention = d * hd * (2 * h + 2 * kv) + qkv_bias * hd * (h + 2 * kv) + bias * d
        mlp = len(self.mlp_activations) * (d * m + bias * m) + m * d + bias * d
        block = attention + mlp + 2 * norm
        logits = 0 if self.tie_embeddings else v * d + bias * v
        return self.num_embedding_params() + self.num_layers * block + norm + logits

    def train_flops_per_token(self, *, targets_length: int, inputs_length: int | None = None) -> float:
        del inputs_length  # a prefix LM's inputs are part of its rows
        return self.flops_per_token(targets_length)

    def activation_stacks(self, *, rows: int, length: int, inputs_length: int | None) -> list[dict[str, float]]:
        q = self.num_heads * self.head_dim
        return [dict(num_layers=self.num_layers, tokens=rows * length, width=self.emb_dim, mlp=self.mlp_dim,
                     n_mlp_in=len(self.mlp_activations), q=q, kv=2 * self.num_kv_heads * self.head_dim,
                     scores=self.num_heads * length)]

    def check_lengths(self, *, sequence_length: int, split: str) -> None:
        if sequence_length > self.max_len:
            raise RunConfigError(
                f"{split} sequence_length={sequence_length} does not fit the model's "
                f"max_len={self.max_len}; lower SEQUENCE_LENGTH or raise DecoderConfig.max_len.")

    def max_prompt_tokens(self, max_new_tokens: int = 1) -> int | None:
        """BOS, the prompt and the new tokens fill at most max_len."""
        return self.max_len - 1 - max_new_tokens

    def describe_context(self) -> str:
        return f"the model's context (max_len={self.max_len}: BOS, the prompt and the new tokens)"

    def decode_call(self, rows, *, method, max_new_tokens, sampling, rng, eos_id, bos_id, use_cache=True,
                    beam_size=4, alpha=0.6):
        if method not in self.decoding_methods:
            raise ConfigValueError(f"Decoding method {method!r} is not one a decoder-only model runs; use one of "
                                   f"{list(self.decoding_methods)}.")
        return generation.decode_call(self, rows, max_new_tokens=max_new_tokens, sampling=sampling, rng=rng,
                                      eos_id=eos_id, bos_id=bos_id, use_cache=use_cache)

    def score_call(self, pairs, *, bos_id):
        """Rows [bos_id, *inputs] + targets ([*inputs] + targets when bos_id is None); [rows, 2]: the
        targets' summed log-probability, and 1.0 where each target token is the argmax."""
        prefix = [] if bos_id is None else [bos_id]
        return generation.score_call(self, [([*prefix, *inputs], targets) for inputs, targets in pairs])

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 x (matmul params, the output projection included) + attention.

        The attention term is 12 * layers * heads * head_dim * seq_len (forward QK^T and AV,
        times three for the backward pass), as in the PaLM appendix; with a sliding window a
        token attends to at most `sliding_window` positions, which replaces seq_len when shorter.
        """
        matmul_params = self.num_params() - self.num_embedding_params()
        if self.tie_embeddings:
            matmul_params += self.vocab_size * self.emb_dim
        attended = seq_len if self.sliding_window is None else min(seq_len, self.sliding_window)
        attention = 12 * self.num_layers * self.num_heads * self.head_dim * attended
        return 6.0 * matmul_params + attention


class DecoderBlock(nn.Module):
    """Pre-norm block: x + Attn(norm(x)); x + MLP(norm(x)). Returns (x, None) for scan.

    `is_causal=False` means `mask` is the whole attention pattern (a prefix LM's), not only
    the packed-segment mask that the attention's own causal mask is added to. `decode=True`
    keeps the attention's keys and values in a KV cache (layers.Attention, kv_cache='append').
    """

    config: DecoderConfig
    deterministic: bool
    is_causal: bool = True
    decode: bool = False

    @nn.compact
    def __call__(self, x: Array, mask: Array | None, positions: Array, segment_ids: Array | None):
        cfg = self.config
        dtype = cfg.compute_dtype
        norm = layers.norm_class(cfg.norm, cfg.norm_epsilon)
        implementation = cfg.attention()
        x = layers.with_logical_constraint(x, ("batch", "length", "embed"))
        h = norm(dtype=dtype, name="attn_norm")(x)
        h = layers.Attention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, dtype,
                             use_rope=cfg.position_embedding == "rope",
                             rope_max_wavelength=cfg.rope_max_wavelength, use_bias=cfg.use_bias,
                             qkv_bias=cfg.qkv_bias, sliding_window=cfg.sliding_window,
                             is_causal=self.is_causal, implementation=implementation,
                             kv_cache="append" if self.decode else "none",
                             cudnn_segments_per_row=cfg.cudnn_segments_per_row, name="attention",
                             )(h, h, mask, q_positions=positions, kv_positions=positions, segment_ids=segment_ids)
        x = x + nn.Dropout(cfg.dropout_rate)(h, deterministic=self.deterministic)
        h = norm(dtype=dtype, name="mlp_norm")(x)
        h = layers.MLP(cfg.mlp_dim, cfg.mlp_activations, dtype, use_bias=cfg.use_bias, name="mlp")(h)
        x = x + nn.Dropout(cfg.dropout_rate)(h, deterministic=self.deterministic)
        return layers.with_logical_constraint(x, ("batch", "length", "embed")), None


class Decoder(nn.Module):
    """The LM: token ids [batch, length] -> float32 logits [batch, length, vocab].

    Arguments carry seqio's feature names, so a batch from the LM or prefix-LM feature
    converter can be passed as keyword arguments. With `decoder_causal_attention` (prefix LM:
    1 on the prefix positions) the prefix attends to itself bidirectionally and every later
    position stays causal.

    `decode=True` runs on a KV cache (the mutable 'cache' collection): the tokens are the new
    ones only (a whole prompt to prefill, then one per step), `decoder_positions` their
    positions, and `cache_mask` [batch, cache_length] is False on the cache slots that hold
    left padding. `init` with `decode=True` sizes the cache from its inputs' length.
    """

    config: DecoderConfig

    @nn.compact
    def __call__(
        self,
        decoder_input_tokens: Array,
        decoder_positions: Array | None = None,
        decoder_segment_ids: Array | None = None,
        decoder_causal_attention: Array | None = None,
        deterministic: bool = True,
        decode: bool = False,
        cache_mask: Array | None = None,
    ) -> Array:
        cfg = self.config
        dtype = cfg.compute_dtype
        tokens = decoder_input_tokens
        positions = decoder_positions
        if positions is None:
            if cfg.position_embedding == "learned" and tokens.shape[-1] > cfg.max_len:
                raise ValueError(f"Sequence length {tokens.shape[-1]} exceeds the learned position table "
                                 f"(max_len={cfg.max_len}).")
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[-1]), tokens.shape)
        # Causality comes from the attention's is_causal; the mask only keeps packed examples apart.
        # A prefix LM's mask is not causal within the prefix, so it carries causality itself.
        is_causal = decoder_causal_attention is None
        packed = cfg.packed_layout() and is_causal and not decode and decoder_segment_ids is not None
        mask = None
        if decode:
            if not is_causal or decoder_segment_ids is not None:
                raise ValueError("decode=True runs a causal LM over one sequence per row: it takes cache_mask, "
                                 "not decoder_causal_attention or decoder_segment_ids.")
            if cache_mask is not None:
                mask = cache_mask[:, None, None, :]
        elif not is_causal:
            mask = masks.make_prefix_lm_mask(decoder_causal_attention, decoder_segment_ids)
        elif decoder_segment_ids is not None and not packed:
            mask = masks.make_bidirectional_mask(decoder_segment_ids, decoder_segment_ids)

        gpt2_init = cfg.tie_embeddings or cfg.position_embedding == "learned"
        embed = layers.Embed(cfg.vocab_size, cfg.emb_dim, dtype, stddev=GPT2_EMBED_STDDEV if gpt2_init else 1.0,
                             name="token_embed")
        x = embed(tokens)
        if cfg.scale_embeddings:
            # sqrt(emb_dim) as a float32, then rounded to the compute dtype (as Gemma computes it).
            x = x * jnp.asarray(np.float32(math.sqrt(cfg.emb_dim)), dtype)
        if cfg.position_embedding == "learned":
            x = x + layers.Embed(cfg.max_len, cfg.emb_dim, dtype, stddev=GPT2_EMBED_STDDEV / 2,
                                 axes=("positions", "embed"), name="position_embed")(positions)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        blocks = stack.stack_layers(DecoderBlock, num_layers=cfg.num_layers, scan=cfg.scan_layers,
                                    unroll=cfg.layers_per_iteration, remat=cfg.remat_policy, num_broadcast=3)
        segment_ids = decoder_segment_ids if packed else None  # packed_attention.py, in place of the mask
        x, _ = blocks(cfg, deterministic, is_causal, decode)(x, mask, positions, segment_ids)
        x = layers.norm_class(cfg.norm, cfg.norm_epsilon)(dtype=dtype, name="final_norm")(x)
        if cfg.tie_embeddings:
            logits = embed.attend(x)
        else:
            # A small output init makes the initial loss ~ln(vocab): the step-0 check relies on it.
            logits = layers.Dense((cfg.vocab_size,), ("embed", "vocab"), dtype, kernel_init=LOGITS_INIT,
                                  use_bias=cfg.use_bias, keep_cast_kernel=True, name="logits")(x)
        return layers.with_logical_constraint(logits.astype(jnp.float32), ("batch", "length", "vocab"))
