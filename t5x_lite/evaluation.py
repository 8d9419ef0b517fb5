"""Evaluation of a decoder-only LM beyond the validation loss: strided perplexity over whole
documents, and multiple-choice scoring (HellaSwag) as lm-evaluation-harness computes it.

Everything reduces to one question asked of the model: the log-probability of some tokens
(a continuation) after others (a prefix). The arithmetic around it (windows, batching,
accuracies) is plain Python and numpy; the one model call is `_score_batch`, jitted with the
model config static.

Input convention (decoder_only.Decoder): the model sees [BOS=0, t1, t2, ...] and the logits at
position i predict token i+1.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import json
import math
import re
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from t5x_lite import metrics, storage
from t5x_lite.errors import EmptyEvalSetError, EvalDataError
from t5x_lite.models import losses
from t5x_lite.models.decoder_only import DecoderConfig

BOS_ID = 0
# Batches are padded up to a multiple of this many tokens (capped at max_len): few compiles.
LENGTH_BUCKET = 64

# A scoring row: (prefix, continuation). The model sees prefix + continuation[:-1] and only the
# continuation's tokens are scored; the prefix is never empty (BOS when there is no context).
_Row = tuple[Sequence[int], Sequence[int]]
# (summed log-probability of the continuation, its token count, whether it is the greedy one)
LogLikelihood = tuple[float, int, bool]


# --- Strided perplexity windows ---------------------------------------------------------------

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


# --- The model call ---------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnums=0)
def _score_batch(model: DecoderConfig, params: Any, inputs: jax.Array, targets: jax.Array,
                 weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per row: the summed log-probability of the weighted targets, and whether each is the argmax."""
    logits = model.make_module().apply({"params": params}, inputs)
    nll, _ = losses.cross_entropy_with_logits(logits, targets)
    scored = weights > 0
    logprob_sums = -jnp.sum(jnp.where(scored, nll, 0.0), axis=-1)
    greedy = jnp.all(jnp.where(scored, jnp.argmax(logits, axis=-1) == targets, True), axis=-1)
    return logprob_sums, greedy


def _bucket(length: int, max_len: int) -> int:
    """`length` rounded up to a multiple of LENGTH_BUCKET, at most max_len."""
    return min(max_len, -(-length // LENGTH_BUCKET) * LENGTH_BUCKET)


def _row_arrays(row: _Row, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Model input and targets of one row; past max_len the oldest (prefix) tokens are dropped."""
    prefix, continuation = row
    tokens = np.asarray([*prefix, *continuation], np.int32)
    return tokens[:-1][-max_len:], tokens[1:][-max_len:]


def _pack(rows: Sequence[_Row], *, batch_size: int, max_len: int) -> tuple[np.ndarray, ...]:
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


def _check_rows(rows: Sequence[_Row], *, model: DecoderConfig, batch_size: int) -> None:
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


def _score_rows(model: DecoderConfig, params: Any, rows: Sequence[_Row], batch_size: int) -> list[LogLikelihood]:
    """Scores every row in batches of similar length; results in the order of `rows`."""
    _check_rows(rows, model=model, batch_size=batch_size)
    # Longest first: rows of similar length share a batch, and a batch too large fails at once.
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]) + len(rows[i][1]), reverse=True)
    results: list[LogLikelihood | None] = [None] * len(rows)
    for start in range(0, len(order), batch_size):
        indices = order[start:start + batch_size]
        batch = _pack([rows[i] for i in indices], batch_size=batch_size, max_len=model.max_len)
        sums, greedy = jax.device_get(_score_batch(model, params, *batch))
        for r, i in enumerate(indices):
            results[i] = (float(sums[r]), len(rows[i][1]), bool(greedy[r]))
    return results  # type: ignore[return-value]  (every slot is filled)


def continuation_logprobs(*, model: DecoderConfig, params: Any,
                          requests: Sequence[tuple[Sequence[int], Sequence[int]]],
                          batch_size: int) -> list[LogLikelihood]:
    """lm-evaluation-harness's `loglikelihood` for (context_ids, continuation_ids) requests.

    For each request, in the input order: the summed log-probability of the continuation
    given [BOS] + context, its token count, and whether every continuation token is the
    model's argmax. Context tokens beyond max_len are dropped from the left.
    """
    rows = [([BOS_ID, *context], continuation) for context, continuation in requests]
    return _score_rows(model, params, rows, batch_size)


# --- Perplexity -------------------------------------------------------------------------------

def _window_row(tokens: Sequence[int], window: Window) -> _Row:
    """A window as a scoring row. A window without context (the first one, and every one when
    stride == context_length) is predicted from BOS, as the document's start is."""
    context = tokens[window.begin:window.score_from] or [BOS_ID]
    return context, tokens[window.score_from:window.end]


def perplexity(*, model: DecoderConfig, params: Any, documents: Iterable[Sequence[int]], context_length: int,
               stride: int, batch_size: int) -> dict[str, float]:
    """Strided perplexity of whole documents, each scored from its start (BOS).

    Returns the mean negative log-likelihood per scored token in nats ("loss"), its exp
    ("perplexity"), and how many tokens and windows were scored.
    """
    if context_length > model.max_len:
        raise ValueError(f"context_length={context_length} exceeds the model's max_len={model.max_len}.")
    rows = []
    for document in documents:
        tokens = list(document)
        windows = strided_windows(len(tokens), context_length=context_length, stride=stride)
        rows.extend(_window_row(tokens, window) for window in windows)
    if not rows:
        raise EmptyEvalSetError("The eval set is empty: the documents hold no tokens to score.")
    results = _score_rows(model, params, rows, batch_size)
    tokens_scored = sum(count for _, count, _ in results)
    loss = -math.fsum(logprob for logprob, _, _ in results) / tokens_scored
    return {"loss": loss, "perplexity": metrics.perplexity(loss), "tokens": tokens_scored, "windows": len(rows)}


# --- Multiple choice (HellaSwag) --------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MultipleChoiceExample:
    """A context, the endings to choose from, and the index of the right one."""

    context: str
    endings: tuple[str, ...]
    label: int

    def __post_init__(self):
        object.__setattr__(self, "endings", tuple(self.endings))
        if not isinstance(self.context, str):
            raise ValueError(f"context must be a string, got {self.context!r}")
        if len(self.endings) < 2:
            raise ValueError(f"needs at least 2 endings, got {len(self.endings)}")
        for i, ending in enumerate(self.endings):
            if not isinstance(ending, str) or not ending:
                raise ValueError(f"ending {i} must be a non-empty string, got {ending!r}")
        if isinstance(self.label, bool) or not isinstance(self.label, int) \
                or not 0 <= self.label < len(self.endings):
            raise ValueError(f"label must be an index into the {len(self.endings)} endings, got {self.label!r}")


def preprocess_hellaswag(text: str) -> str:
    """lm-evaluation-harness's HellaSwag clean-up of the WikiHow artifacts ("[title]", "[header]", ...)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


_SIMPLE_FIELDS = ("context", "endings", "label")
_HELLASWAG_FIELDS = ("activity_label", "ctx_a", "ctx_b", "endings", "label")
_FORMATS = f"either {', '.join(_SIMPLE_FIELDS)} or HellaSwag's {', '.join(_HELLASWAG_FIELDS)}"


def _field(record: dict, name: str, kind: type = object) -> Any:
    if name not in record:
        raise ValueError(f"missing field {name!r} (a line holds {_FORMATS})")
    value = record[name]
    if not isinstance(value, kind):
        raise ValueError(f"field {name!r} must be a {kind.__name__}, got {value!r}")
    return value


def _label(value: Any) -> int:
    """An integer label; HellaSwag's Hugging Face copy stores it as a string of digits."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"label must be an integer, got {value!r}")


def _parse_example(record: Any) -> MultipleChoiceExample:
    """One jsonl record in the simple format (taken as it is) or HellaSwag's (preprocessed)."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object holding {_FORMATS}")
    endings = _field(record, "endings", list)
    if "context" in record:
        context = _field(record, "context", str)
    else:
        context = preprocess_hellaswag(_field(record, "activity_label", str) + ": " + _field(record, "ctx_a", str)
                                       + " " + _field(record, "ctx_b", str).capitalize())
        endings = [preprocess_hellaswag(e) if isinstance(e, str) else e for e in endings]
    label = _label(_field(record, "label"))
    return MultipleChoiceExample(context=context, endings=tuple(endings), label=label)


def _open_text(path: str):
    if storage.is_url(path):
        return storage.open(path, "r")
    try:
        return builtins.open(path, encoding="utf-8")
    except FileNotFoundError:
        raise EvalDataError(f"{path} does not exist.") from None


def read_hellaswag(path: str) -> list[MultipleChoiceExample]:
    """Multiple-choice examples from a jsonl file, one JSON object a line (blank lines skipped).

    Two formats, told apart per line:
      - the public HellaSwag jsonl (hellaswag_val.jsonl: activity_label, ctx_a, ctx_b, endings,
        label, ...), preprocessed as lm-evaluation-harness does: context =
        preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()), each ending
        preprocessed (see `preprocess_hellaswag`);
      - a simpler {"context": str, "endings": [str, ...], "label": int}, taken as it is.
    Any number (>= 2) of endings is accepted. A malformed line raises EvalDataError naming the
    file and line; a file without examples raises EmptyEvalSetError.
    """
    examples = []
    with _open_text(path) as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                examples.append(_parse_example(json.loads(line)))
            except ValueError as e:  # json.JSONDecodeError is a ValueError too
                raise EvalDataError(f"{path}:{line_number}: {e}") from None
    if not examples:
        raise EmptyEvalSetError(f"The eval set is empty: {path} holds no examples.")
    return examples


def score_multiple_choice(*, model: DecoderConfig, params: Any, examples: Sequence[MultipleChoiceExample],
                          encode: Callable[[str], list[int]], batch_size: int) -> dict[str, float]:
    """Accuracy of picking the most likely ending, as lm-evaluation-harness scores HellaSwag.

    Each ending is scored as the continuation " " + ending of the context. "acc" picks the
    highest summed log-likelihood; "acc_norm" divides it by the ending's length in UTF-8
    bytes first, so long endings are not penalised for their length alone.
    """
    if not examples:
        raise EmptyEvalSetError("The eval set is empty: there are no multiple-choice examples.")
    requests = []
    for example in examples:
        context = encode(example.context)
        requests.extend((context, encode(" " + ending)) for ending in example.endings)
    results = continuation_logprobs(model=model, params=params, requests=requests, batch_size=batch_size)
    correct = correct_norm = 0
    start = 0
    for example in examples:
        loglikelihoods = np.asarray([ll for ll, _, _ in results[start:start + len(example.endings)]])
        start += len(example.endings)
        num_bytes = np.asarray([len(ending.encode("utf-8")) for ending in example.endings], np.float64)
        correct += int(np.argmax(loglikelihoods) == example.label)
        correct_norm += int(np.argmax(loglikelihoods / num_bytes) == example.label)
    n = len(examples)
    return {"acc": correct / n, "acc_norm": correct_norm / n, "examples": n}
