"""Causal self-attention over packed rows on cuDNN, given as each segment's offset and length.

`jax.nn.dot_product_attention` takes packing as a dense [batch, 1, length, length] mask, which
reaches cuDNN as an additive bias: the fused kernel reads it and its backward pass writes its
gradient, and the work between segments is done and then masked away. cuDNN's packed layout
takes, per row, where each run of one segment id starts and how long it is instead, and attends
within each run only (docs/performance.md, GPU section, for what that saves).
JAX exposes that layout only through its private `fused_attention_stablehlo` module, which is
used here and nowhere else (its signature is the same in jax 0.10 and 0.11).

`layers.Attention` calls `causal_packed_attention` when given segment ids (`DecoderConfig.
cudnn_segments_per_row`); `segment_runs` is the pure part, tested on any backend. `check_rows`
refuses, on the host and before any step, a batch with a row the layout cannot hold.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax._src.cudnn import fused_attention_stablehlo as _cudnn

from t5x_lite.errors import TaskDataError

Array = jnp.ndarray


def segment_runs(segment_ids: Array, max_segments: int) -> tuple[Array, Array, Array]:
    """The runs of equal consecutive ids in each row of `segment_ids` [batch, length].

    Returns (offsets [batch, max_segments + 1], lengths [batch, max_segments], overflow
    [batch] bool): each run's first position and its length, -1 past the row's last run, as
    cuDNN's packed layout takes them. Padding (id 0) forms runs like any other id, so every
    position belongs to one run and attends within it, as `masks.make_attention_mask` lets it.
    `overflow` marks rows with more than `max_segments` runs: the runs past that are missing.
    """
    batch, length = segment_ids.shape
    starts = jnp.concatenate([jnp.ones((batch, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    run = jnp.cumsum(starts, axis=1, dtype=jnp.int32) - 1  # each position's run index
    rows = jnp.arange(batch)[:, None]
    lengths = jnp.zeros((batch, max_segments), jnp.int32).at[rows, run].add(1, mode="drop")
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    first = jnp.where(starts, run, max_segments + 1)  # out of range: dropped by the scatter
    offsets = jnp.full((batch, max_segments + 1), -1, jnp.int32).at[rows, first].set(positions, mode="drop")
    return offsets, jnp.where(lengths > 0, lengths, -1), run[:, -1] >= max_segments


def check_rows(segment_ids: np.ndarray, max_segments: int) -> None:
    """Raises TaskDataError when a row of the host batch's `segment_ids` holds more runs of one
    segment id than `max_segments`: on the device that row would come out NaN."""
    runs = 1 + np.count_nonzero(np.diff(segment_ids, axis=-1), axis=-1)
    if runs.size and runs.max() > max_segments:
        most = int(runs.max())
        raise TaskDataError(
            f"A packed row of this batch holds {most} segments (runs of one segment id; a padding tail counts "
            f"as one), more than DecoderConfig.cudnn_segments_per_row={max_segments} lays out for cuDNN. Set "
            f"--gin.DecoderConfig.cudnn_segments_per_row to at least {most} (the most segments the data packs "
            "into one row), or to None to pass packed rows as a dense mask. The batch was not trained on.")


def causal_packed_attention(q: Array, k: Array, v: Array, segment_ids: Array, *, max_segments: int,
                            scale: float | None = None) -> Array:
    """Causal attention of q, k, v [batch, length, heads, head_dim] within each run of
    `segment_ids`, on cuDNN's packed layout (GPUs; 16-bit q, k, v; cuDNN 9.6 or later).

    A row with more than `max_segments` runs comes out NaN rather than silently attending across
    the runs past the last one (the train loop refuses such a batch first: `check_rows`).
    """
    offsets, lengths, overflow = segment_runs(segment_ids, max_segments)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = _cudnn.dot_product_attention(q, k, v, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=offsets,
                                       kv_offsets=offsets, scale=scale, mask_type=_cudnn.MaskType.CAUSAL)
    return jnp.where(overflow[:, None, None, None], jnp.asarray(jnp.nan, out.dtype), out)
