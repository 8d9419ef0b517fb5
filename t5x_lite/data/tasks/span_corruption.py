"""T5 span-corruption tasks over directories written by `t5x-lite prepare`.

The prepared token ids are chunked, concatenated and split so that, after noising, the
inputs fill `inputs` exactly (t5's `random_spans_helper` arithmetic); then
`t5.data.preprocessors.span_corruption` replaces about 15% of the tokens, in spans of mean
length 3, with sentinel ids and makes the targets the dropped spans. The vocabulary is the
prepared SentencePiece model plus `EXTRA_IDS` sentinel ids at the top of the id range.
"""

from __future__ import annotations

import functools

from t5x_lite import storage
from t5x_lite.data.tasks.lm import register_prepared_task
from t5x_lite.tf_setup import import_tensorflow

import_tensorflow()

import seqio  # noqa: E402
from t5.data import preprocessors as t5_preprocessors  # noqa: E402

EXTRA_IDS = 100


def span_corruption_lengths(inputs_length: int, *, noise_density: float = 0.15,
                            mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """(raw tokens per example, targets length) that fill `inputs_length` after noising."""
    return t5_preprocessors.random_spans_helper(
        inputs_length=inputs_length, noise_density=noise_density,
        mean_noise_span_length=mean_noise_span_length,
        extra_tokens_per_span_inputs=1, extra_tokens_per_span_targets=1, verbose=False)


def register_span_corruption_task(name: str, data_dir: str, *, noise_density: float = 0.15,
                                  mean_noise_span_length: float = 3.0) -> seqio.Task:
    """Registers (or re-registers) a span-corruption task `name` over a prepared directory."""
    return register_prepared_task(
        name, data_dir, features=("inputs", "targets"), extra_ids=EXTRA_IDS,
        preprocessors=[
            functools.partial(t5_preprocessors.span_corruption, noise_density=noise_density,
                              mean_noise_span_length=mean_noise_span_length),
            seqio.preprocessors.append_eos_after_trim,
        ],
    )


@functools.cache
def _registered(name: str, data_dir: str, noise_density: float, mean_noise_span_length: float) -> str:
    register_span_corruption_task(name, data_dir, noise_density=noise_density,
                                  mean_noise_span_length=mean_noise_span_length)
    return name


def span_corruption_task(*, name: str, data_dir: str, noise_density: float = 0.15,
                         mean_noise_span_length: float = 3.0) -> str:
    """Registers the span-corruption task `name` over `data_dir` once and returns its name (for gin)."""
    return _registered(name, storage.absolute(data_dir), noise_density,
                       mean_noise_span_length)
