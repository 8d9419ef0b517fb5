"""An encoder-decoder's (T5's) generation and scoring programs, and the batches they read.

The encoder runs once; the decoder caches its self-attention keys and values, and its
cross-attention keys and values over the encoder output are computed once, at the BOS step,
and cached too. Beam search (t5x's) flattens beams into the batch and reorders the cache rows by
beam each step. Encoder inputs are right-padded with 0, the encoder's padding.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from t5x_lite.models.generation import (NEG_INF, PAD_ID, Array, DecodeCall, Step, brevity_penalty, bucket,
                                        by_rows, empty_cache, for_decoding, mask_pad, no_scores, sample_loop)


def pad_inputs(inputs: Sequence[Sequence[int] | None]) -> np.ndarray:
    """Encoder inputs right-padded with 0 (the encoder's padding) to a bucketed length; a padding
    row (None) repeats the first input, so it computes nothing a real row would not."""
    real = [x for x in inputs if x is not None]
    out = np.full((len(inputs), bucket(max(len(x) for x in real))), PAD_ID, np.int32)
    for row, x in enumerate(inputs):
        x = real[0] if x is None else x
        out[row, :len(x)] = x
    return out


def seq2seq_steps(module: nn.Module, params: Any, inputs: Array, encoded: Array, *,
                   cache_length: int) -> tuple[Array, Any, Step]:
    """The logits after BOS, the initial cache and a cached step for T5 decoding.

    Token i is fed at slot i + 1 (BOS holds slot 0). The first call computes the cross-attention
    keys and values of `encoded` into the cache; later steps reuse them.
    """

    def run(cache, new_tokens, encoded):
        logits, variables = module.apply({"params": params, "cache": cache}, encoded, inputs, new_tokens,
                                         method="decode", decode=True, max_decode_length=cache_length,
                                         mutable=["cache"])
        return logits[:, -1], variables["cache"]

    bos = jnp.full((inputs.shape[0], 1), PAD_ID, jnp.int32)
    cache = empty_cache(lambda: module.init(jax.random.PRNGKey(0), encoded, inputs,
                                             jnp.zeros((inputs.shape[0], cache_length), jnp.int32), method="decode",
                                             decode=True, max_decode_length=cache_length))
    logits, cache = run(cache, bos, encoded)
    return logits, cache, lambda cache, token, i: run(cache, token[:, None], None)


@partial(jax.jit, static_argnames=("config", "max_decode_length", "sampling", "use_cache"))
def generate_program(params: Any, inputs: Array, limits: Array, rng: Array, eos_id: Array, *, config: Any,
                     max_decode_length: int, sampling: tuple, use_cache: bool) -> tuple[Array, Array]:
    """Greedy or sampled tokens [batch, max_decode_length] for the encoder inputs."""
    module = config.make_module()
    encoded = module.apply({"params": params}, inputs, method="encode")
    cache_length = max_decode_length + 1  # BOS, then up to max_decode_length tokens
    if use_cache:
        logits, state, step = seq2seq_steps(module, params, inputs, encoded, cache_length=cache_length)
    else:
        def logits_at(buffer, slot):
            logits = module.apply({"params": params}, encoded, inputs, buffer, method="decode")
            return jax.lax.dynamic_index_in_dim(logits, slot, axis=1, keepdims=False)

        def step(buffer, token, i):
            buffer = jax.lax.dynamic_update_index_in_dim(buffer, token, i + 1, axis=1)
            return logits_at(buffer, i + 1), buffer

        state = jnp.full((inputs.shape[0], cache_length), PAD_ID, jnp.int32)
        logits = logits_at(state, 0)
    return no_scores(by_rows(sample_loop(step, state, logits, rng, limits, eos_id, num_steps=max_decode_length,
                                         sampling=dict(sampling))))


def reorder_cache(cache: Any, rows: Array) -> Any:
    """The KV cache with its batch rows replaced by `rows` (beam i continues beam rows[i]).

    A cached key or value is [..., batch, length, heads, head_dim] (scanned layers add a leading
    layers axis); cache indices (rank 0 or 1) are shared by all rows and kept.
    """
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=x.ndim - 4) if x.ndim >= 4 else x, cache)


@partial(jax.jit, static_argnames=("config", "max_decode_length", "beam_size"))
def beam_program(params: Any, inputs: Array, alpha: Array, eos_id: Array, *, config: Any,
                 max_decode_length: int, beam_size: int) -> tuple[Array, Array]:
    """t5x's beam search on a KV cache: the best hypothesis per row ([batch, length]) and its score ([batch, 1]).

    Beams are flattened into the batch ([batch * beams]); each step the 2 * beams best extensions
    are split into the best `beams` still alive and newly finished ones, which compete with the
    earlier finished hypotheses by score log p / brevity_penalty(alpha, length).
    """
    batch, beams, length = inputs.shape[0], beam_size, max_decode_length
    module = config.make_module()
    encoded = jnp.repeat(module.apply({"params": params}, inputs, method="encode"), beams, axis=0)
    logits, cache, step = seq2seq_steps(module, params, jnp.repeat(inputs, beams, axis=0), encoded,
                                         cache_length=length + 1)
    rows = jnp.arange(batch)[:, None]

    def pick(x, index):  # x [batch, n, ...], index [batch, k] -> [batch, k, ...]
        return x[rows, index]

    def cond(s):
        i, live_logprobs, _, finished_scores, finished, _, _, _ = s
        # The best a live beam can still score: log-probs only fall; the penalty is largest at full length.
        best_live = live_logprobs[:, 0] / brevity_penalty(alpha, length)
        settled = jnp.all(finished, axis=1) & (jnp.min(finished_scores, axis=1) > best_live)
        return (i < length) & ~jnp.all(settled)

    def body(s):
        i, live_logprobs, live_seqs, finished_scores, finished, finished_seqs, logits, cache = s
        vocab = logits.shape[-1]
        logprobs = jax.nn.log_softmax(mask_pad(logits)).reshape(batch, beams, vocab) + live_logprobs[..., None]
        top_logprobs, top_index = jax.lax.top_k(logprobs.reshape(batch, beams * vocab), 2 * beams)
        top_beam, top_token = top_index // vocab, (top_index % vocab).astype(jnp.int32)
        top_seqs = pick(live_seqs, top_beam).at[:, :, i].set(top_token)
        ended = top_token == eos_id
        # The best `beams` extensions that did not end stay alive.
        live_logprobs, alive = jax.lax.top_k(top_logprobs + ended * NEG_INF, beams)
        live_seqs, live_beam = pick(top_seqs, alive), pick(top_beam, alive)
        # Those that ended compete with the earlier finished ones.
        scores = top_logprobs / brevity_penalty(alpha, i + 1) + (~ended) * NEG_INF
        finished_scores, best = jax.lax.top_k(jnp.concatenate([finished_scores, scores], axis=1), beams)
        finished = pick(jnp.concatenate([finished, ended], axis=1), best)
        finished_seqs = pick(jnp.concatenate([finished_seqs, top_seqs], axis=1), best)
        cache = reorder_cache(cache, (rows * beams + live_beam).reshape(-1))
        logits, cache = step(cache, live_seqs[:, :, i].reshape(-1), i)
        return i + 1, live_logprobs, live_seqs, finished_scores, finished, finished_seqs, logits, cache

    seqs = jnp.full((batch, beams, length), PAD_ID, jnp.int32)
    live_logprobs = jnp.tile(jnp.asarray([0.0] + [NEG_INF] * (beams - 1), jnp.float32), (batch, 1))
    no_scores = jnp.full((batch, beams), NEG_INF, jnp.float32)
    state = (jnp.int32(0), live_logprobs, seqs, no_scores, jnp.zeros((batch, beams), bool), seqs, logits, cache)
    _, live_logprobs, live_seqs, finished_scores, finished, finished_seqs, _, _ = jax.lax.while_loop(cond, body, state)
    # An input with no finished hypothesis returns its live beams (all at full length).
    any_finished = jnp.any(finished, axis=1)
    seqs = jnp.where(any_finished[:, None, None], finished_seqs, live_seqs)
    scores = jnp.where(any_finished[:, None], finished_scores, live_logprobs / brevity_penalty(alpha, length))
    return by_rows(seqs[:, 0]), by_rows(scores[:, :1])


def decode_call(config: Any, inputs: Sequence[Sequence[int] | None], *, method: str, max_new_tokens: int,
                sampling: tuple, rng: Any, eos_id: int, use_cache: bool, beam_size: int, alpha: float) -> DecodeCall:
    """One batch of encoder inputs (None: padding) as `generate_program` or `beam_program` reads it."""
    if method == "beam":
        return DecodeCall(program=beam_program, rows=(pad_inputs(inputs),), shared=(np.float32(alpha), np.int32(eos_id)),
                          static=dict(config=for_decoding(config), max_decode_length=int(max_new_tokens),
                                      beam_size=int(beam_size)))
    limits = np.asarray([0 if x is None else max_new_tokens for x in inputs], np.int32)
    return DecodeCall(program=generate_program, rows=(pad_inputs(inputs), limits), shared=(rng, np.int32(eos_id)),
                      static=dict(config=for_decoding(config), max_decode_length=int(max_new_tokens),
                                  use_cache=bool(use_cache), sampling=sampling))


@partial(jax.jit, static_argnames="config")
def score_program(params: Any, inputs: Array, targets: Array, *, config: Any) -> Array:
    """[batch, 1]: per row, the sum of log p(target token); padding (id 0) is not scored."""
    decoder_inputs = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]  # shift right: BOS = 0
    logits = config.make_module().apply({"params": params}, encoder_input_tokens=inputs,
                                        decoder_input_tokens=decoder_inputs)
    logprobs = jax.nn.log_softmax(logits.astype(jnp.float32))
    picked = jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
    sums = jnp.sum(jnp.where(targets > 0, picked, 0.0), axis=-1, keepdims=True)
    return nn.with_logical_constraint(sums, ("batch", None))


def _pad(sequences: Sequence[Sequence[int]]) -> np.ndarray:
    """[rows, length] int32, zero-padded; the length rounded up to a multiple of 16 to limit recompiles."""
    length = max(16, -(-max(len(s) for s in sequences) // 16) * 16)
    out = np.zeros((len(sequences), length), np.int32)
    for i, s in enumerate(sequences):
        out[i, :len(s)] = s
    return out


def score_call(config: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> DecodeCall:
    """(inputs, targets) pairs as `score_program` reads them."""
    return DecodeCall(program=score_program, rows=(_pad([p[0] for p in pairs]), _pad([p[1] for p in pairs])),
                      static=dict(config=config))
