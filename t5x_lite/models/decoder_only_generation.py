"""A decoder-only LM's generation and scoring programs, and the batches they read.

Prompts of different lengths share one batch LEFT-padded, so every row's next token lands in
the same cache slot; each row has its own positions (slot - padding) and the padding slots are
masked out of attention. Lengths are rounded up to a multiple of LENGTH_BUCKET, so a stream of
batches reuses a few compiled programs. The model reads [BOS, t1, t2, ...]; the logits at
position i predict token i + 1.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from t5x_lite.models import losses
from t5x_lite.models.generation import (PAD_ID, STOPPED, Array, DecodeCall, bucket, by_rows, empty_cache,
                                        for_decoding, no_scores, sample_loop)

# Scored batches are padded up to a multiple of this many tokens (capped at max_len): few compiles.
SCORE_LENGTH_BUCKET = 64


@partial(jax.jit, static_argnames=("config", "prompt_slots", "sampling", "use_cache"))
def generate_program(params: Any, tokens: Array, pad: Array, limits: Array, rng: Array, eos_id: Array, *,
                     config: Any, prompt_slots: int, sampling: tuple, use_cache: bool) -> tuple[Array, Array]:
    """New tokens [batch, slots - prompt_slots] after the left-padded prompts in tokens[:, :prompt_slots]."""
    module = config.make_module()
    slots = jnp.arange(tokens.shape[1])
    positions = jnp.maximum(slots[None, :] - pad[:, None], 0)  # [batch, slots]; 0 on the padding
    valid = slots[None, :] >= pad[:, None]
    last = prompt_slots - 1  # every prompt ends in this slot
    if use_cache:
        def run(cache, new_tokens, start):
            width = new_tokens.shape[1]
            logits, variables = module.apply(
                {"params": params, "cache": cache}, new_tokens, decode=True, cache_mask=valid, mutable=["cache"],
                decoder_positions=jax.lax.dynamic_slice_in_dim(positions, start, width, axis=1))
            return logits[:, -1], variables["cache"]

        cache = empty_cache(lambda: module.init(jax.random.PRNGKey(0), tokens, decoder_positions=positions,
                                                 decode=True, cache_mask=valid))
        logits, state = run(cache, tokens[:, :prompt_slots], 0)
        step = lambda cache, token, i: run(cache, token[:, None], prompt_slots + i)  # noqa: E731
    else:
        segment_ids = valid.astype(jnp.int32)

        def logits_at(buffer, slot):
            logits = module.apply({"params": params}, buffer, decoder_positions=positions,
                                  decoder_segment_ids=segment_ids)
            return jax.lax.dynamic_index_in_dim(logits, slot, axis=1, keepdims=False)

        def step(buffer, token, i):
            buffer = jax.lax.dynamic_update_index_in_dim(buffer, token, prompt_slots + i, axis=1)
            return logits_at(buffer, prompt_slots + i), buffer

        logits, state = logits_at(tokens, last), tokens
    return no_scores(by_rows(sample_loop(step, state, logits, rng, limits, eos_id,
                                         num_steps=tokens.shape[1] - prompt_slots, sampling=dict(sampling))))


def decode_call(config: Any, prompts: Sequence[Sequence[int] | None], *, max_new_tokens: int, sampling: tuple,
                rng: Any, eos_id: int, bos_id: int, use_cache: bool) -> DecodeCall:
    """One batch of prompts (None: a padding row, which generates nothing) as `generate_program` reads it.

    Row r's tokens stop at its EOS, after `max_new_tokens`, or when BOS + prompt + new tokens fill
    `config.max_len`; PAD_ID follows (STOPPED with `sampling`'s zero_is_token). `bos_id` is the
    first token the model reads.
    """
    lengths = [len(p) + 1 if p is not None else 1 for p in prompts]  # the model reads [BOS, t1, t2, ...]
    limits = [max(0, min(max_new_tokens, config.max_len - n)) if p is not None else 0
              for p, n in zip(prompts, lengths)]
    if max(limits) == 0:
        return DecodeCall.stopped(len(prompts), fill=STOPPED if dict(sampling).get("zero_is_token") else PAD_ID)
    prompt_slots = bucket(max(lengths))
    tokens = np.full((len(prompts), bucket(prompt_slots + max(limits))), PAD_ID, np.int32)
    pad = np.asarray([prompt_slots - n for n in lengths], np.int32)
    for row, prompt in enumerate(prompts):
        if prompt is not None:
            tokens[row, prompt_slots - len(prompt) - 1] = bos_id  # BOS sits just before the prompt
        if prompt:
            tokens[row, prompt_slots - len(prompt):prompt_slots] = prompt
    return DecodeCall(program=generate_program, rows=(tokens, pad, np.asarray(limits, np.int32)),
                      shared=(rng, np.int32(eos_id)),
                      static=dict(config=for_decoding(config), prompt_slots=prompt_slots, use_cache=bool(use_cache),
                                  sampling=sampling))


# --- scoring ----------------------------------------------------------------------------------

@partial(jax.jit, static_argnames="config")
def score_program(params: Any, inputs: Array, targets: Array, weights: Array, *, config: Any) -> Array:
    """[batch, 2]: per row, the summed log-probability of the weighted targets, and 1.0 where each
    of them is the argmax."""
    logits = config.make_module().apply({"params": params}, inputs)
    nll, _ = losses.cross_entropy_with_logits(logits, targets)
    scored = weights > 0
    logprob_sums = -jnp.sum(jnp.where(scored, nll, 0.0), axis=-1)
    greedy = jnp.all(jnp.where(scored, jnp.argmax(logits, axis=-1) == targets, True), axis=-1)
    out = jnp.stack([logprob_sums, greedy.astype(jnp.float32)], axis=-1)
    return nn.with_logical_constraint(out, ("batch", None))


def _score_length(length: int, max_len: int) -> int:
    """`length` rounded up to a multiple of SCORE_LENGTH_BUCKET, at most max_len."""
    return min(max_len, -(-length // SCORE_LENGTH_BUCKET) * SCORE_LENGTH_BUCKET)


def _row_arrays(row: tuple[Sequence[int], Sequence[int]], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Model input and targets of one row; past max_len the oldest (prefix) tokens are dropped."""
    prefix, continuation = row
    tokens = np.asarray([*prefix, *continuation], np.int32)
    return tokens[:-1][-max_len:], tokens[1:][-max_len:]


def score_call(config: Any, rows: Sequence[tuple[Sequence[int], Sequence[int]]]) -> DecodeCall:
    """(prefix, continuation) rows as `score_program` reads them: the model sees prefix +
    continuation[:-1] and only the continuation is scored. Padding goes after each row (causal
    attention keeps it from changing the real positions) and has weight 0."""
    arrays = [_row_arrays(row, config.max_len) for row in rows]
    length = _score_length(max(len(inputs) for inputs, _ in arrays), config.max_len)
    inputs = np.zeros((len(rows), length), np.int32)
    targets = np.zeros((len(rows), length), np.int32)
    weights = np.zeros((len(rows), length), np.float32)
    for r, ((row_inputs, row_targets), (_, continuation)) in enumerate(zip(arrays, rows)):
        n = len(row_inputs)
        inputs[r, :n] = row_inputs
        targets[r, :n] = row_targets
        weights[r, n - len(continuation):n] = 1.0
    return DecodeCall(program=score_program, rows=(inputs, targets, weights), static=dict(config=config))
