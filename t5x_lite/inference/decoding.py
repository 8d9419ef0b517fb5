"""Autoregressive decoding: greedy and sampled generation for both model families, beam search for T5.

Every method runs as one jitted program with a `jax.lax.while_loop` over new tokens, on a KV
cache (the models' `decode=True` mode): a prompt is read once (prefill), then each step feeds
one token and attends over the cached keys and values. `use_cache=False` re-runs the whole
model over the same buffer for every token instead (O(length^2)): the exact reference.

Decoder-only prompts of different lengths share one batch LEFT-padded, so every row's next
token lands in the same cache slot; each row has its own positions (slot - padding) and the
padding slots are masked out of attention. Lengths are rounded up to a multiple of
LENGTH_BUCKET, so a stream of batches reuses a few compiled programs.

Encoder-decoder (T5): the encoder runs once; the decoder caches its self-attention keys and
values, and its cross-attention keys and values over the encoder output are computed once, at
the BOS step, and cached too. Beam search flattens beams into the batch and reorders the cache
rows by beam each step.

With a `Placement` the params stay sharded as the placement put them and each batch's rows are
split over the mesh's batch axes (padding rows fill the last shard); without one, everything
runs on this process's first device. Each function returns every prompt's output on every
process.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from t5x_lite.models.decoder_only import DecoderConfig
from t5x_lite.models.encoder_decoder import T5Config
from t5x_lite.parallel import placement as placement_lib
from t5x_lite.parallel.placement import Placement, RowResults

Array = jax.Array
PAD_ID = 0  # padding; also BOS, the first input token of both decoders (a decoder-only model's can be another:
# `bos_id`, a Hugging Face tokenizer's BOS, data/tokenizer_files.py)
STOPPED = -1  # a stopped row's later entries when id 0 is a real token of the vocabulary (`zero_is_token`)
LENGTH_BUCKET = 8
NEG_INF = -1.0e7  # a finite "impossible" score for beam search (as t5x): sums of it stay ordered


def filter_logits(logits: Array, *, temperature: float, top_k: int, top_p: float) -> Array:
    """Applies temperature, top-k and nucleus (top-p) filtering to [..., vocab] logits.

    Filtered entries become -inf; at least the most likely token always survives.
    """
    logits = logits.astype(jnp.float32) / max(temperature, 1e-6)
    if top_k:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
        # Keep tokens until the mass before them reaches top_p (the first one always stays).
        keep_sorted = (cumulative - jax.nn.softmax(sorted_logits, axis=-1)) < top_p
        threshold = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return logits


def brevity_penalty(alpha: float, length: Array | int) -> Array:
    """GNMT's length penalty ((5 + length) / 6) ** alpha (t5x's beam search); alpha = 0: none."""
    return jnp.power((5.0 + jnp.asarray(length, jnp.float32)) / 6.0, alpha)


# ---------------------------------------------------------------------------- shared pieces


def _bucket(length: int) -> int:
    """`length` rounded up to a multiple of LENGTH_BUCKET (at least one bucket)."""
    return max(1, -(-length // LENGTH_BUCKET)) * LENGTH_BUCKET


def _for_decoding(config: Any) -> Any:
    """The config to decode with: no remat (no gradients are taken), so the cache is a plain collection."""
    return dataclasses.replace(config, remat_policy="none")


def _empty_cache(init: Callable[[], Any]) -> Any:
    """A zero KV cache shaped by `init` (a model init with decode=True), without running it."""
    shapes = jax.eval_shape(init)["cache"]
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _mask_pad(logits: Array) -> Array:
    """Padding is never a real next token."""
    return logits.at[..., PAD_ID].set(-jnp.inf)


def _next_token(logits: Array, key: Array, *, temperature: float, top_k: int, top_p: float,
                zero_is_token: bool = False) -> Array:
    """[batch, vocab] logits -> [batch] tokens: argmax at temperature 0, else a filtered sample.

    Id 0 is never chosen unless it is a real token of the vocabulary (GPT-2's "!").
    """
    logits = logits if zero_is_token else _mask_pad(logits)
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    filtered = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)


# A step feeds token i ([batch]) and returns the logits of the token after it and the new state.
Step = Callable[[Any, Array, Array], tuple[Array, Any]]


def _sample_loop(step: Step, state: Any, logits: Array, rng: Array, limits: Array, eos_id: Array, *,
                 num_steps: int, sampling: dict) -> Array:
    """Samples [batch, num_steps] tokens from `logits` on; row r stops at EOS or after limits[r] tokens.

    The loop ends when every row has stopped; a stopped row's later entries are PAD_ID (STOPPED
    when id 0 is a real token: `sampling`'s zero_is_token).
    """
    fill = STOPPED if sampling.get("zero_is_token") else PAD_ID

    def cond(carry):
        i, _, _, _, _, done = carry
        return (i < num_steps) & ~jnp.all(done)

    def body(carry):
        i, out, state, logits, rng, done = carry
        rng, key = jax.random.split(rng)
        token = jnp.where(done, PAD_ID, _next_token(logits, key, **sampling))
        out = out.at[:, i].set(jnp.where(done, fill, token))
        done = done | (token == eos_id) | (i + 1 >= limits)
        logits, state = step(state, token, i)
        return i + 1, out, state, logits, rng, done

    out = jnp.full((logits.shape[0], num_steps), fill, jnp.int32)
    carry = (jnp.int32(0), out, state, logits, rng, limits <= 0)
    return jax.lax.while_loop(cond, body, carry)[1]


def until_eos(tokens: Sequence[int], eos_id: int, *, zero_is_token: bool = False) -> list[int]:
    """The tokens before the first EOS or padding (a stopped row's later entries are PAD_ID, or
    STOPPED when id 0 is a real token: then 0 is kept)."""
    out = []
    for t in tokens:
        if t == eos_id or t < 0 or (t == PAD_ID and not zero_is_token):
            break
        out.append(int(t))
    return out


def _rows(x: Array) -> Array:
    """Keeps a batch-major result split by rows (placement.local_rows reads each process's own)."""
    return nn.with_logical_constraint(x, ("batch", *([None] * (x.ndim - 1))))


def _padded(items: Sequence[Any], placement: Placement) -> tuple[list[Any], list[int]]:
    """The items with None rows added up to the placement's batch shards, and the row ids (-1: padding)."""
    rows = placement.padded_rows(len(items))
    return list(items) + [None] * (rows - len(items)), list(range(len(items))) + [-1] * (rows - len(items))


def sampling_settings(temperature: float, top_k: int, top_p: float, *, zero_is_token: bool = False) -> tuple:
    """Sampling settings as a hashable (static) jit argument; `zero_is_token`: id 0 may be generated."""
    settings = ("temperature", float(temperature)), ("top_k", int(top_k)), ("top_p", float(top_p))
    return settings + ((("zero_is_token", True),) if zero_is_token else ())


# ---------------------------------------------------------------------------- decoder-only


@partial(jax.jit, static_argnames=("config", "prompt_slots", "sampling", "use_cache"))
def _lm_generate(config: DecoderConfig, params: Any, tokens: Array, pad: Array, limits: Array, rng: Array,
                 eos_id: Array, *, prompt_slots: int, sampling: tuple, use_cache: bool) -> Array:
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

        cache = _empty_cache(lambda: module.init(jax.random.PRNGKey(0), tokens, decoder_positions=positions,
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
    return _rows(_sample_loop(step, state, logits, rng, limits, eos_id, num_steps=tokens.shape[1] - prompt_slots,
                              sampling=dict(sampling)))


def lm_batch(*, model: DecoderConfig, params: Any, prompts: Sequence[Sequence[int] | None], max_new_tokens: int,
             rng: Array, sampling: tuple, eos_id: int, use_cache: bool, placement: Placement,
             bos_id: int = PAD_ID) -> Array | np.ndarray:
    """[rows, width] new tokens of one batch of prompts (None: a padding row, which generates nothing).

    Row r's tokens stop at its EOS, after `max_new_tokens`, or when BOS + prompt + new tokens
    fill `model.max_len`; PAD_ID follows (STOPPED with `sampling`'s zero_is_token). The rows are
    split over the placement's batch axes. `bos_id` is the first token the model reads.
    """
    lengths = [len(p) + 1 if p is not None else 1 for p in prompts]  # the model reads [BOS, t1, t2, ...]
    limits = [max(0, min(max_new_tokens, model.max_len - n)) if p is not None else 0
              for p, n in zip(prompts, lengths)]
    if max(limits) == 0:
        return np.full((len(prompts), 1), STOPPED if dict(sampling).get("zero_is_token") else PAD_ID, np.int32)
    prompt_slots = _bucket(max(lengths))
    tokens = np.full((len(prompts), _bucket(prompt_slots + max(limits))), PAD_ID, np.int32)
    pad = np.asarray([prompt_slots - n for n in lengths], np.int32)
    for row, prompt in enumerate(prompts):
        if prompt is not None:
            tokens[row, prompt_slots - len(prompt) - 1] = bos_id  # BOS sits just before the prompt
        if prompt:
            tokens[row, prompt_slots - len(prompt):prompt_slots] = prompt
    with placement.context():
        return _lm_generate(_for_decoding(model), params, placement.put(tokens), placement.put(pad),
                            placement.put(np.asarray(limits, np.int32)), placement.replicated(rng),
                            placement.replicated(np.int32(eos_id)), prompt_slots=prompt_slots,
                            use_cache=bool(use_cache), sampling=sampling)


def check_lm_prompts(model: DecoderConfig, prompts: Sequence[Sequence[int]]) -> None:
    for i, prompt in enumerate(prompts):
        if len(prompt) + 1 > model.max_len:
            raise ValueError(f"Prompt {i} has {len(prompt)} tokens but the model's max_len is {model.max_len}: "
                             f"BOS + prompt must fit; shorten it to at most {model.max_len - 1} tokens.")


def generate_batch(*, model: DecoderConfig, params: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                   rng: Array, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, eos_id: int = 1,
                   use_cache: bool = True, placement: Placement | None = None, bos_id: int = PAD_ID,
                   zero_is_token: bool = False) -> list[list[int]]:
    """Continues each prompt of a decoder-only LM; returns only the new tokens, EOS excluded.

    Each row stops at its own EOS, after `max_new_tokens`, or when BOS + prompt + new tokens
    fill `model.max_len`. temperature 0 is greedy; otherwise top-k / top-p sampling. An empty
    prompt continues from BOS alone. All prompts form one batch (padded to the batch shards).
    `bos_id` is the model's first token and `zero_is_token` lets id 0 be generated: a Hugging
    Face tokenizer's (data/tokenizer_files.py `decoder_start_id`, `zero_is_token`).
    """
    if not prompts:
        return []
    check_lm_prompts(model, prompts)
    placement = placement or placement_lib.of_params(params)
    rows, ids = _padded(prompts, placement)
    out = lm_batch(model=model, params=params, prompts=rows, max_new_tokens=max_new_tokens, rng=rng, eos_id=eos_id,
                   sampling=sampling_settings(temperature, top_k, top_p, zero_is_token=zero_is_token),
                   use_cache=use_cache, placement=placement, bos_id=bos_id)
    results = RowResults(placement, total=len(prompts), width=max(1, max_new_tokens), dtype=np.int32,
                         fill=STOPPED if zero_is_token else PAD_ID)
    results.add(ids, out)
    return [until_eos(row, eos_id, zero_is_token=zero_is_token) for row in results.gather()]


def generate(*, model: nn.Module | DecoderConfig, params: Any, prompt: Sequence[int], max_new_tokens: int,
             max_len: int, rng: Array, temperature: float = 0.8, top_k: int = 40, top_p: float = 1.0,
             eos_id: int = 1) -> list[int]:
    """One prompt through `generate_batch`, with BOS + prompt + new tokens capped at `max_len`."""
    config = model.config if isinstance(model, nn.Module) else model
    if len(prompt) + 1 > max_len:
        raise ValueError(f"The prompt has {len(prompt)} tokens but max_len is {max_len}; shorten the prompt.")
    max_new_tokens = min(max_new_tokens, max_len - len(prompt) - 1)
    return generate_batch(model=config, params=params, prompts=[prompt], max_new_tokens=max_new_tokens, rng=rng,
                          temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos_id)[0]


# ---------------------------------------------------------------------------- encoder-decoder


def _pad_inputs(inputs: Sequence[Sequence[int] | None]) -> np.ndarray:
    """Encoder inputs right-padded with 0 (the encoder's padding) to a bucketed length; a padding
    row (None) repeats the first input, so it computes nothing a real row would not."""
    real = [x for x in inputs if x is not None]
    out = np.full((len(inputs), _bucket(max(len(x) for x in real))), PAD_ID, np.int32)
    for row, x in enumerate(inputs):
        x = real[0] if x is None else x
        out[row, :len(x)] = x
    return out


def _seq2seq_steps(module: nn.Module, params: Any, inputs: Array, encoded: Array, *,
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
    cache = _empty_cache(lambda: module.init(jax.random.PRNGKey(0), encoded, inputs,
                                             jnp.zeros((inputs.shape[0], cache_length), jnp.int32), method="decode",
                                             decode=True, max_decode_length=cache_length))
    logits, cache = run(cache, bos, encoded)
    return logits, cache, lambda cache, token, i: run(cache, token[:, None], None)


@partial(jax.jit, static_argnames=("config", "max_decode_length", "sampling", "use_cache"))
def _seq2seq_generate(config: T5Config, params: Any, inputs: Array, limits: Array, rng: Array, eos_id: Array, *,
                      max_decode_length: int, sampling: tuple, use_cache: bool) -> Array:
    module = config.make_module()
    encoded = module.apply({"params": params}, inputs, method="encode")
    cache_length = max_decode_length + 1  # BOS, then up to max_decode_length tokens
    if use_cache:
        logits, state, step = _seq2seq_steps(module, params, inputs, encoded, cache_length=cache_length)
    else:
        def logits_at(buffer, slot):
            logits = module.apply({"params": params}, encoded, inputs, buffer, method="decode")
            return jax.lax.dynamic_index_in_dim(logits, slot, axis=1, keepdims=False)

        def step(buffer, token, i):
            buffer = jax.lax.dynamic_update_index_in_dim(buffer, token, i + 1, axis=1)
            return logits_at(buffer, i + 1), buffer

        state = jnp.full((inputs.shape[0], cache_length), PAD_ID, jnp.int32)
        logits = logits_at(state, 0)
    return _rows(_sample_loop(step, state, logits, rng, limits, eos_id, num_steps=max_decode_length,
                              sampling=dict(sampling)))


def seq2seq_batch(*, model: T5Config, params: Any, inputs: Sequence[Sequence[int] | None], max_decode_length: int,
                  rng: Array, sampling: tuple, eos_id: int, use_cache: bool, placement: Placement) -> Array:
    """[rows, max_decode_length] greedy or sampled tokens of one batch of encoder inputs (None: padding)."""
    limits = np.asarray([0 if x is None else max_decode_length for x in inputs], np.int32)
    with placement.context():
        return _seq2seq_generate(_for_decoding(model), params, placement.put(_pad_inputs(inputs)), placement.put(limits),
                                 placement.replicated(rng), placement.replicated(np.int32(eos_id)),
                                 max_decode_length=int(max_decode_length), use_cache=bool(use_cache),
                                 sampling=sampling)


def generate_seq2seq(*, model: T5Config, params: Any, inputs: Sequence[Sequence[int]], max_decode_length: int,
                     rng: Array, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, eos_id: int = 1,
                     use_cache: bool = True, placement: Placement | None = None) -> list[list[int]]:
    """Greedy (temperature 0) or sampled outputs of an encoder-decoder, EOS excluded, one per input.

    Each output stops at its EOS or after `max_decode_length` tokens.
    """
    if not inputs:
        return []
    placement = placement or placement_lib.of_params(params)
    rows, ids = _padded(inputs, placement)
    out = seq2seq_batch(model=model, params=params, inputs=rows, max_decode_length=max_decode_length, rng=rng,
                        sampling=sampling_settings(temperature, top_k, top_p), eos_id=eos_id, use_cache=use_cache,
                        placement=placement)
    results = RowResults(placement, total=len(inputs), width=max_decode_length, dtype=np.int32, fill=PAD_ID)
    results.add(ids, out)
    return [until_eos(row, eos_id) for row in results.gather()]


def _reorder_cache(cache: Any, rows: Array) -> Any:
    """The KV cache with its batch rows replaced by `rows` (beam i continues beam rows[i]).

    A cached key or value is [..., batch, length, heads, head_dim] (scanned layers add a leading
    layers axis); cache indices (rank 0 or 1) are shared by all rows and kept.
    """
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=x.ndim - 4) if x.ndim >= 4 else x, cache)


@partial(jax.jit, static_argnames=("config", "max_decode_length", "beam_size"))
def _beam_search(config: T5Config, params: Any, inputs: Array, alpha: Array, eos_id: Array, *,
                 max_decode_length: int, beam_size: int) -> tuple[Array, Array]:
    """t5x's beam search on a KV cache: the best hypothesis per row ([batch, length]) and its score ([batch, 1]).

    Beams are flattened into the batch ([batch * beams]); each step the 2 * beams best extensions
    are split into the best `beams` still alive and newly finished ones, which compete with the
    earlier finished hypotheses by score log p / brevity_penalty(alpha, length).
    """
    batch, beams, length = inputs.shape[0], beam_size, max_decode_length
    module = config.make_module()
    encoded = jnp.repeat(module.apply({"params": params}, inputs, method="encode"), beams, axis=0)
    logits, cache, step = _seq2seq_steps(module, params, jnp.repeat(inputs, beams, axis=0), encoded,
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
        logprobs = jax.nn.log_softmax(_mask_pad(logits)).reshape(batch, beams, vocab) + live_logprobs[..., None]
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
        cache = _reorder_cache(cache, (rows * beams + live_beam).reshape(-1))
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
    return _rows(seqs[:, 0]), _rows(scores[:, :1])


def beam_batch(*, model: T5Config, params: Any, inputs: Sequence[Sequence[int] | None], max_decode_length: int,
               beam_size: int, alpha: float, eos_id: int, placement: Placement) -> tuple[Array, Array]:
    """The best hypothesis ([rows, max_decode_length]) and its score ([rows, 1]) of one batch (None: padding)."""
    with placement.context():
        return _beam_search(_for_decoding(model), params, placement.put(_pad_inputs(inputs)),
                            placement.replicated(np.float32(alpha)), placement.replicated(np.int32(eos_id)),
                            max_decode_length=int(max_decode_length), beam_size=int(beam_size))


def beam_search_with_scores(*, model: T5Config, params: Any, inputs: Sequence[Sequence[int]],
                            max_decode_length: int, beam_size: int = 4, alpha: float = 0.6,
                            eos_id: int = 1, placement: Placement | None = None) -> list[tuple[list[int], float]]:
    """The best beam-search hypothesis per input (EOS excluded) and its score.

    The score is log p(tokens + EOS) / brevity_penalty(alpha, len(tokens) + 1) for a finished
    hypothesis; an input with none finished gets its best unfinished one, scored
    log p(tokens) / brevity_penalty(alpha, max_decode_length).
    """
    if not inputs:
        return []
    if max_decode_length < 1 or beam_size < 1:
        raise ValueError(f"max_decode_length={max_decode_length} and beam_size={beam_size} must be at least 1.")
    placement = placement or placement_lib.of_params(params)
    rows, ids = _padded(inputs, placement)
    seqs, scores = beam_batch(model=model, params=params, inputs=rows, max_decode_length=max_decode_length,
                              beam_size=beam_size, alpha=alpha, eos_id=eos_id, placement=placement)
    tokens = RowResults(placement, total=len(inputs), width=max_decode_length, dtype=np.int32, fill=PAD_ID)
    values = RowResults(placement, total=len(inputs), width=1, dtype=np.float32)
    tokens.add(ids, seqs)
    values.add(ids, scores, count=False)
    return [(until_eos(row, eos_id), float(score[0])) for row, score in zip(tokens.gather(), values.gather())]


def beam_search(*, model: T5Config, params: Any, inputs: Sequence[Sequence[int]], max_decode_length: int,
                beam_size: int = 4, alpha: float = 0.6, eos_id: int = 1,
                placement: Placement | None = None) -> list[list[int]]:
    """The best beam-search output per input, EOS excluded (see beam_search_with_scores)."""
    return [tokens for tokens, _ in beam_search_with_scores(model=model, params=params, inputs=inputs,
                                                            max_decode_length=max_decode_length, beam_size=beam_size,
                                                            alpha=alpha, eos_id=eos_id, placement=placement)]
