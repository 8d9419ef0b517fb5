"""Autoregressive sampling from the decoder-only LM.

Each new token re-runs the model over a fixed-size buffer (one compiled program for the whole
generation). That costs O(length^2) but is exact and simple; it is meant for samples during
and after training, not for serving.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from flax import linen as nn

Array = jax.Array
PAD_ID = 0


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


@partial(jax.jit, static_argnames=("model", "temperature", "top_k", "top_p", "eos_id"))
def _generate(model: nn.Module, params, buffer: Array, prompt_len: Array, end: Array, rng: Array, *,
              temperature: float, top_k: int, top_p: float, eos_id: int) -> tuple[Array, Array]:
    def cond(carry):
        i, _, _, done = carry
        return (i < end) & ~done

    def body(carry):
        i, buf, rng, _ = carry
        logits = model.apply({"params": params}, buf)[0, i - 1]
        logits = logits.at[PAD_ID].set(-jnp.inf)  # padding is never a real next token
        rng, key = jax.random.split(rng)
        if temperature == 0.0:
            token = jnp.argmax(logits)
        else:
            token = jax.random.categorical(key, filter_logits(logits, temperature=temperature,
                                                              top_k=top_k, top_p=top_p))
        buf = buf.at[0, i].set(token.astype(buf.dtype))
        return i + 1, buf, rng, token == eos_id

    i, buf, _, _ = jax.lax.while_loop(cond, body, (prompt_len, buffer, rng, jnp.array(False)))
    return buf, i


def generate(*, model: nn.Module, params, prompt: list[int], max_new_tokens: int, max_len: int,
             rng: Array, temperature: float = 0.8, top_k: int = 40, top_p: float = 1.0,
             eos_id: int = 1) -> list[int]:
    """Samples up to `max_new_tokens` tokens after `prompt`; stops early at `eos_id`.

    temperature 0 means greedy decoding. Returns only the new tokens (EOS excluded).
    """
    # The model reads [BOS=0, t1, t2, ...]: logits at position i predict token i+1.
    if len(prompt) + 1 > max_len:
        raise ValueError(f"The prompt has {len(prompt)} tokens but the model's max_len is {max_len}; "
                         "shorten the prompt.")
    buffer = jnp.zeros((1, max_len), jnp.int32).at[0, 1 : len(prompt) + 1].set(jnp.asarray(prompt, jnp.int32))
    start = len(prompt) + 1
    end = min(start + max_new_tokens, max_len)
    buf, stop = _generate(model, params, buffer, jnp.int32(start), jnp.int32(end), rng,
                          temperature=float(temperature), top_k=int(top_k), top_p=float(top_p),
                          eos_id=int(eos_id))
    new = [int(t) for t in buf[0, start:int(stop)]]
    return new[:-1] if new and new[-1] == eos_id else new
