"""Strided perplexity over whole documents, as Hugging Face computes it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Sequence

from t5x_lite.errors import EmptyEvalSetError
from t5x_lite.inference import scoring
from t5x_lite.metrics import arithmetic as metric_math
from t5x_lite.models.decoder_only import DecoderConfig
from t5x_lite.parallel.placement import Placement


@dataclasses.dataclass(frozen=True)
class Window:
    """One model call over tokens[begin:end]; only tokens[score_from:end] are scored."""

    begin: int
    end: int
    score_from: int


def strided_windows(num_tokens: int, *, context_length: int, stride: int) -> list[Window]:
    """Hugging Face's strided perplexity windows over a sequence of `num_tokens` tokens.

    A window of at most `context_length` tokens starts every `stride` tokens and scores only
    the tokens no earlier window scored, so every token is scored exactly once and, after the
    first window, with at least context_length - stride tokens of context.
    """
    if context_length < 1:
        raise ValueError(f"context_length must be at least 1, got {context_length}.")
    if not 1 <= stride <= context_length:
        raise ValueError(f"stride must be in [1, context_length={context_length}], got {stride}.")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must not be negative, got {num_tokens}.")
    windows = []
    scored_until = 0
    for begin in range(0, num_tokens, stride):
        end = min(begin + context_length, num_tokens)
        windows.append(Window(begin=begin, end=end, score_from=scored_until))
        scored_until = end
        if end == num_tokens:
            break
    return windows


def _window_row(tokens: Sequence[int], window: Window, bos_id: int = scoring.BOS_ID) -> scoring.Row:
    """A window as a scoring row. A window without context (the first one, and every one when
    stride == context_length) is predicted from BOS, as the document's start is."""
    context = tokens[window.begin:window.score_from] or [bos_id]
    return context, tokens[window.score_from:window.end]


def document_rows(document: Sequence[int], *, context_length: int, stride: int,
                  bos_id: int = scoring.BOS_ID) -> list[scoring.Row]:
    """The scoring rows of one document's strided windows: their log-probabilities sum to the
    document's log-likelihood (lm_eval_model.py's `loglikelihood_rolling` scores them so).
    `bos_id`: the model's first token (a Hugging Face tokenizer's BOS, else EOS)."""
    tokens = list(document)
    return [_window_row(tokens, window, bos_id)
            for window in strided_windows(len(tokens), context_length=context_length, stride=stride)]


def perplexity(*, model: DecoderConfig, params: Any, documents: Iterable[Sequence[int]], context_length: int,
               stride: int, batch_size: int, placement: Placement | None = None,
               bos_id: int = scoring.BOS_ID) -> dict[str, float]:
    """Strided perplexity of whole documents, each scored from its start (`bos_id`).

    Returns the mean negative log-likelihood per scored token in nats ("loss"), its exp
    ("perplexity"), and how many tokens and windows were scored.
    """
    if context_length > model.max_len:
        raise ValueError(f"context_length={context_length} exceeds the model's max_len={model.max_len}.")
    rows = []
    for document in documents:
        rows.extend(document_rows(document, context_length=context_length, stride=stride, bos_id=bos_id))
    if not rows:
        raise EmptyEvalSetError("The eval set is empty: the documents hold no tokens to score.")
    results = scoring.score_rows(model, params, rows, batch_size, placement)
    tokens_scored = sum(count for _, count, _ in results)
    loss = -math.fsum(logprob for logprob, _, _ in results) / tokens_scored
    return {"loss": loss, "perplexity": metric_math.perplexity(loss), "tokens": tokens_scored, "windows": len(rows)}
