"""Evaluation of a decoder-only LM beyond the validation loss: strided perplexity over whole
documents, and multiple-choice scoring (HellaSwag) as lm-evaluation-harness computes it.

Everything reduces to one question asked of the model: the log-probability of some tokens
(a continuation) after others (a prefix). The arithmetic around it (windows, batching,
accuracies) is plain Python and numpy; the one model call is `_score_batch`, jitted with the
model config static. With a `Placement`, each batch's rows are split over its mesh (every
process and device scores its own) and the per-row results are combined once, at the end.

Input convention (decoder_only.Decoder): the model sees [BOS, t1, t2, ...] and the logits at
position i predict token i+1. BOS is 0 (seqio's vocabularies) or, given as `bos_id`, a Hugging
Face tokenizer's BOS (else EOS). Padding is told by the weights, never by token id 0.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from t5x_lite.models import losses
from t5x_lite.models.decoder_only import DecoderConfig
from t5x_lite.parallel import placement as placement_lib
from t5x_lite.parallel.placement import Placement, RowResults

BOS_ID = 0
# Batches are padded up to a multiple of this many tokens (capped at max_len): few compiles.
LENGTH_BUCKET = 64

# A scoring row: (prefix, continuation). The model sees prefix + continuation[:-1] and only the
# continuation's tokens are scored; the prefix is never empty (BOS when there is no context).
Row = tuple[Sequence[int], Sequence[int]]
# (summed log-probability of the continuation, its token count, whether it is the greedy one)
LogLikelihood = tuple[float, int, bool]


# --- The model call ---------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnums=0)
def _score_batch(model: DecoderConfig, params: Any, inputs: jax.Array, targets: jax.Array,
                 weights: jax.Array) -> jax.Array:
    """[batch, 2]: per row, the summed log-probability of the weighted targets, and 1.0 where each
    of them is the argmax."""
    logits = model.make_module().apply({"params": params}, inputs)
    nll, _ = losses.cross_entropy_with_logits(logits, targets)
    scored = weights > 0
    logprob_sums = -jnp.sum(jnp.where(scored, nll, 0.0), axis=-1)
    greedy = jnp.all(jnp.where(scored, jnp.argmax(logits, axis=-1) == targets, True), axis=-1)
    out = jnp.stack([logprob_sums, greedy.astype(jnp.float32)], axis=-1)
    return nn.with_logical_constraint(out, ("batch", None))


def _bucket(length: int, max_len: int) -> int:
    """`length` rounded up to a multiple of LENGTH_BUCKET, at most max_len."""
    return min(max_len, -(-length // LENGTH_BUCKET) * LENGTH_BUCKET)


def _row_arrays(row: Row, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Model input and targets of one row; past max_len the oldest (prefix) tokens are dropped."""
    prefix, continuation = row
    tokens = np.asarray([*prefix, *continuation], np.int32)
    return tokens[:-1][-max_len:], tokens[1:][-max_len:]


def _pack(rows: Sequence[Row], *, batch_size: int, max_len: int) -> tuple[np.ndarray, ...]:
    """Inputs, targets and weights of exactly `batch_size` rows; padding has weight 0.

    Padding goes after each row (causal attention keeps it from changing the real positions)
    and fills the missing rows, so every batch has one of few shapes.
    """
    arrays = [_row_arrays(row, max_len) for row in rows]
    length = _bucket(max(len(inputs) for inputs, _ in arrays), max_len)
    inputs = np.zeros((batch_size, length), np.int32)
    targets = np.zeros((batch_size, length), np.int32)
    weights = np.zeros((batch_size, length), np.float32)
    for r, ((row_inputs, row_targets), (_, continuation)) in enumerate(zip(arrays, rows)):
        n = len(row_inputs)
        inputs[r, :n] = row_inputs
        targets[r, :n] = row_targets
        weights[r, n - len(continuation):n] = 1.0
    return inputs, targets, weights


def _check_rows(rows: Sequence[Row], *, model: DecoderConfig, batch_size: int) -> None:
    """Fails before compiling on what the model cannot score."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    for i, (prefix, continuation) in enumerate(rows):
        if not continuation:
            raise ValueError(f"Request {i} has an empty continuation: there is nothing to score.")
        if len(continuation) > model.max_len:
            raise ValueError(f"Request {i}'s continuation has {len(continuation)} tokens, more than the "
                             f"model's max_len={model.max_len}.")
        ids = [*prefix, *continuation]
        if min(ids) < 0 or max(ids) >= model.vocab_size:
            raise ValueError(f"Request {i} holds token ids outside [0, vocab_size={model.vocab_size}): "
                             f"{min(ids)}..{max(ids)}; was the text encoded with the model's vocabulary?")


def score_rows(model: DecoderConfig, params: Any, rows: Sequence[Row], batch_size: int,
               placement: Placement | None = None) -> list[LogLikelihood]:
    """Scores every row in batches of similar length; results in the order of `rows`, on every process.

    `batch_size` rows per model call over the whole mesh (rounded up to its batch shards).
    """
    _check_rows(rows, model=model, batch_size=batch_size)
    placement = placement or placement_lib.of_params(params)
    # Longest first: rows of similar length share a batch, and a batch too large fails at once.
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]) + len(rows[i][1]), reverse=True)
    results = RowResults(placement, total=len(rows), width=2, dtype=np.float32)
    for batch in placement_lib.batch_schedule(len(order), batch_size, placement):
        ids = [order[i] if i >= 0 else -1 for i in batch]
        # A padding row repeats the batch's first row, so it needs no shape of its own.
        arrays = _pack([rows[i if i >= 0 else ids[0]] for i in ids], batch_size=len(ids), max_len=model.max_len)
        with placement.context():
            results.add(ids, _score_batch(model, params, *(placement.put(a) for a in arrays)))
    return [(float(s), len(row[1]), bool(g)) for (s, g), row in zip(results.gather(), rows)]


def continuation_logprobs(*, model: DecoderConfig, params: Any,
                          requests: Sequence[tuple[Sequence[int], Sequence[int]]],
                          batch_size: int, placement: Placement | None = None,
                          bos_id: int = BOS_ID) -> list[LogLikelihood]:
    """lm-evaluation-harness's `loglikelihood` for (context_ids, continuation_ids) requests.

    For each request, in the input order: the summed log-probability of the continuation
    given [BOS] + context, its token count, and whether every continuation token is the
    model's argmax. Context tokens beyond max_len are dropped from the left. `bos_id`: the
    model's first token (a Hugging Face tokenizer's BOS, else EOS: data/tokenizer_files.py).
    Every continuation token is scored, id 0 included (rows carry weights, not padding ids).
    """
    rows = [([bos_id, *context], continuation) for context, continuation in requests]
    return score_rows(model, params, rows, batch_size, placement)


