"""What every family's generation shares: token choice, the sampling loop, the batch of one call.

A family's `decode_call` (models/base.py) lays one batch of prompts out as host arrays and names
the jitted program that generates from them (decoder_only_generation.py,
encoder_decoder_generation.py); inference/decoding.py places the arrays on a mesh and runs it.
The programs are pure JAX: a `jax.lax.while_loop` over new tokens on a KV cache (the modules'
`decode=True` mode), or with `use_cache=False` the whole model re-run over the buffer for
every token (O(length^2), the exact reference).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from t5x_lite.errors import ConfigValueError

Array = jax.Array
PAD_ID = 0  # padding; also BOS, the first input token of both decoders (a decoder-only model's can be another:
# `bos_id`, a Hugging Face tokenizer's BOS, data/vocab/tokenizer_files.py)
STOPPED = -1  # a stopped row's later entries when id 0 is a real token of the vocabulary (`zero_is_token`)
LENGTH_BUCKET = 8
NEG_INF = -1.0e7  # a finite "impossible" score for beam search (as t5x): sums of it stay ordered

# A step feeds token i ([batch]) and returns the logits of the token after it and the new state.
Step = Callable[[Any, Array, Array], tuple[Array, Any]]


class PromptTooLongError(ConfigValueError):
    """A prompt leaves no room in the model's context for the new tokens asked for."""


@dataclasses.dataclass(frozen=True)
class DecodeCall:
    """One batch of generation or scoring, as a family lays it out.

    `program(params, *rows, *shared, **static)` is jitted; `rows` are batch-major host arrays
    (split over the mesh's batch axes), `shared` host values every device gets whole (a PRNG key,
    the EOS id), `static` its static arguments. A generation program returns (tokens [rows, width],
    scores [rows, 1]); a scoring program [rows, k] floats. `result`, when set, is the answer
    without running anything (every row already stopped).
    """

    program: Callable[..., Any] | None
    rows: tuple[np.ndarray, ...] = ()
    shared: tuple[Any, ...] = ()
    static: dict[str, Any] = dataclasses.field(default_factory=dict)
    result: Any = None

    @classmethod
    def stopped(cls, rows: int, *, fill: int) -> "DecodeCall":
        """Every row stopped before its first new token."""
        return cls(program=None, result=(np.full((rows, 1), fill, np.int32), np.zeros((rows, 1), np.float32)))


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


def bucket(length: int) -> int:
    """`length` rounded up to a multiple of LENGTH_BUCKET (at least one bucket)."""
    return max(1, -(-length // LENGTH_BUCKET)) * LENGTH_BUCKET


def for_decoding(config: Any) -> Any:
    """The config to decode with: no remat (no gradients are taken), so the cache is a plain collection."""
    return dataclasses.replace(config, remat_policy="none")


def empty_cache(init: Callable[[], Any]) -> Any:
    """A zero KV cache shaped by `init` (a model init with decode=True), without running it."""
    shapes = jax.eval_shape(init)["cache"]
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def mask_pad(logits: Array) -> Array:
    """Padding is never a real next token."""
    return logits.at[..., PAD_ID].set(-jnp.inf)


def next_token(logits: Array, key: Array, *, temperature: float, top_k: int, top_p: float,
                zero_is_token: bool = False) -> Array:
    """[batch, vocab] logits -> [batch] tokens: argmax at temperature 0, else a filtered sample.

    Id 0 is never chosen unless it is a real token of the vocabulary (GPT-2's "!").
    """
    logits = logits if zero_is_token else mask_pad(logits)
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    filtered = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)


def sample_loop(step: Step, state: Any, logits: Array, rng: Array, limits: Array, eos_id: Array, *,
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
        token = jnp.where(done, PAD_ID, next_token(logits, key, **sampling))
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


def by_rows(x: Array) -> Array:
    """Keeps a batch-major result split by rows (placement.local_rows reads each process's own)."""
    return nn.with_logical_constraint(x, ("batch", *([None] * (x.ndim - 1))))


def check_sampling(temperature: float, top_k: int, top_p: float, *, prefix: str = "") -> None:
    """The one rule for sampling settings: temperature >= 0 (0: greedy), top_k >= 0 (0: all tokens), top_p in
    (0, 1] (1: all tokens); a ConfigValueError names the first bad one as `prefix` + its name (`--`, a flag)."""
    if not temperature >= 0:  # NaN too
        raise ConfigValueError(f"{prefix}temperature={temperature} must be >= 0 (0 means greedy).")
    if not top_k >= 0:
        raise ConfigValueError(f"{prefix}top_k={top_k} must be >= 0 (0 keeps every token).")
    if not 0 < top_p <= 1:
        raise ConfigValueError(f"{prefix}top_p={top_p} must be in (0, 1] (1 keeps every token).")


def sampling_settings(temperature: float, top_k: int, top_p: float, *, zero_is_token: bool = False) -> tuple:
    """Sampling settings, checked (`check_sampling`), as a hashable (static) jit argument; `zero_is_token`:
    id 0 may be generated."""
    check_sampling(temperature, top_k, top_p)
    settings = ("temperature", float(temperature)), ("top_k", int(top_k)), ("top_p", float(top_p))
    return settings + ((("zero_is_token", True),) if zero_is_token else ())


def no_scores(tokens: Array) -> tuple[Array, Array]:
    """(tokens, zero scores): what a sampling program returns beside its tokens."""
    return tokens, by_rows(jnp.zeros((tokens.shape[0], 1), jnp.float32))
