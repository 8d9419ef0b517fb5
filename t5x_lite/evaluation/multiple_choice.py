"""Multiple-choice scoring (HellaSwag) as lm-evaluation-harness computes it."""

from __future__ import annotations

import builtins
import dataclasses
import json
import re
from typing import Any, Callable, Sequence

import numpy as np

from t5x_lite import storage
from t5x_lite.errors import EmptyEvalSetError, EvalDataError
from t5x_lite.inference import scoring
from t5x_lite.models.decoder_only import DecoderConfig
from t5x_lite.parallel.placement import Placement


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
                          encode: Callable[[str], list[int]], batch_size: int,
                          placement: Placement | None = None, bos_id: int = scoring.BOS_ID) -> dict[str, float]:
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
    results = scoring.continuation_logprobs(model=model, params=params, requests=requests, batch_size=batch_size,
                                            placement=placement, bos_id=bos_id)
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


_SIMPLE_FIELDS = ("context", "endings", "label")


_HELLASWAG_FIELDS = ("activity_label", "ctx_a", "ctx_b", "endings", "label")


_FORMATS = f"either {', '.join(_SIMPLE_FIELDS)} or HellaSwag's {', '.join(_HELLASWAG_FIELDS)}"
