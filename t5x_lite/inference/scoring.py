"""Evaluation of a decoder-only LM beyond the validation loss: strided perplexity over whole
documents, and multiple-choice scoring (HellaSwag) as lm-evaluation-harness computes it.

Everything reduces to one question asked of the model: the log-probability of some tokens
(a continuation) after others (a prefix). The arithmetic around it (windows, batching,
accuracies) is plain Python and numpy; the one model call is the family's `score_call`
(models/decoder_only_generation.py: rows padded to a multiple of 64 tokens, few compiles). With a `Placement`, each batch's rows are split over its mesh (every
process and device scores its own) and the per-row results are combined once, at the end.

Input convention (decoder_only.Decoder): the model sees [BOS, t1, t2, ...] and the logits at
position i predict token i+1. BOS is 0 (seqio's vocabularies) or, given as `bos_id`, a Hugging
Face tokenizer's BOS (else EOS). Padding is told by the weights, never by token id 0.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from t5x_lite.inference import decoding
from t5x_lite.models import BaseModel
from t5x_lite.parallel import placement as placement_lib
from t5x_lite.parallel.placement import Placement, RowResults

BOS_ID = 0

# A scoring row: (prefix, continuation). The model sees prefix + continuation[:-1] and only the
# continuation's tokens are scored; the prefix is never empty (BOS when there is no context).
Row = tuple[Sequence[int], Sequence[int]]
# (summed log-probability of the continuation, its token count, whether it is the greedy one)
LogLikelihood = tuple[float, int, bool]


def _check_rows(rows: Sequence[Row], *, model: BaseModel, batch_size: int) -> None:
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


def score_rows(model: BaseModel, params: Any, rows: Sequence[Row], batch_size: int,
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
        call = model.score_call([rows[i if i >= 0 else ids[0]] for i in ids], bos_id=None)
        results.add(ids, decoding.run(call, params=params, placement=placement))
    return [(float(s), len(row[1]), bool(g)) for (s, g), row in zip(results.gather(), rows)]


def continuation_logprobs(*, model: BaseModel, params: Any,
                          requests: Sequence[tuple[Sequence[int], Sequence[int]]],
                          batch_size: int, placement: Placement | None = None,
                          bos_id: int = BOS_ID) -> list[LogLikelihood]:
    """lm-evaluation-harness's `loglikelihood` for (context_ids, continuation_ids) requests.

    For each request, in the input order: the summed log-probability of the continuation
    given [BOS] + context, its token count, and whether every continuation token is the
    model's argmax. Context tokens beyond max_len are dropped from the left. `bos_id`: the
    model's first token (a Hugging Face tokenizer's BOS, else EOS: data/vocab/tokenizer_files.py).
    Every continuation token is scored, id 0 included (rows carry weights, not padding ids).
    """
    rows = [([bos_id, *context], continuation) for context, continuation in requests]
    return score_rows(model, params, rows, batch_size, placement)


