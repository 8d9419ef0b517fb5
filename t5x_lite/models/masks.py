"""Attention masks: pure functions of segment ids, prefix flags and slots, [batch, 1, q, kv] bool.

True where a query may attend to a key. Padding (segment 0) attends only to padding, so every
row has at least one True.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def make_attention_mask(segment_ids: Array) -> Array:
    """Causal mask that also keeps packed sequences apart: [batch, 1, q_len, kv_len] bool.

    Position i may attend to j when j <= i and both tokens belong to the same segment.
    Padding (segment 0) attends only to padding, so every row has at least one True.
    """
    length = segment_ids.shape[-1]
    causal = jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))
    same_segment = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (causal[None] & same_segment)[:, None]


def make_prefix_lm_mask(causal_attention: Array, segment_ids: Array | None = None) -> Array:
    """Prefix-LM self-attention mask: [batch, 1, q_len, kv_len] bool.

    `causal_attention` is seqio's `decoder_causal_attention` [batch, length]: 1 on the prefix
    (the inputs and the first target position, whose input token is the prefix's last).
    Position i may attend to j when j <= i, or when both are in the prefix (the prefix sees
    itself bidirectionally); with packing, only within the same segment.
    """
    length = causal_attention.shape[-1]
    causal = jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))[None]
    prefix = causal_attention.astype(jnp.bool_)
    mask = causal | (prefix[:, :, None] & prefix[:, None, :])
    if segment_ids is not None:
        mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
    return mask[:, None]


def make_bidirectional_mask(q_segment_ids: Array, kv_segment_ids: Array) -> Array:
    """Encoder and cross-attention mask: [batch, 1, q_len, kv_len] bool, same segment only.

    Segment 0 marks padding; like the causal mask, padding attends only to padding.
    """
    return (q_segment_ids[:, :, None] == kv_segment_ids[:, None, :])[:, None]


def sliding_window_mask(q_slots: Array, kv_len: int, window: int) -> Array:
    """[q_len, kv_len] bool: the query in slot i may see key slot j when i - j < window (itself and
    the window - 1 slots before it); whether later slots are seen is left to the causal mask.

    Slots are indices in the row (or the KV cache); with packing or left padding, within one
    segment their differences equal the differences of positions.
    """
    return (q_slots[:, None] - jnp.arange(kv_len)[None, :]) < window
