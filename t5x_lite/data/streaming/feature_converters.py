"""seqio's feature converters, with the decoder start token and a real token 0 taken care of.

seqio's converters (and its packing) take token id 0 for padding: loss weights are `targets != 0`,
packing cuts each example to its count of nonzero ids and gives id-0 positions segment 0, and
`decoder_input_tokens` start from id 0. In a Hugging Face vocabulary id 0 is often a real token
(GPT-2's and Qwen2's "!", LLaMA's <unk>) and the model expects its own first token (LLaMA's BOS).

`feature_converter` gives the converter a decoder-only model reads with the vocabulary's
decoder start (`tokenizer_files.decoder_start_id`: BOS, else EOS, for a Hugging Face tokenizer;
0 for seqio's vocabularies, as before). When id 0 is a real token of the vocabulary
(`zero_is_token`), every id is raised by one before seqio's conversion (so no real token is 0)
and lowered again after it on the positions that hold tokens, padding staying 0: packing, segment
ids, positions and loss weights are then exactly those of the same text without the pitfall.
An encoder-decoder reads its encoder's padding off token 0 (models/encoder_decoder.py), so
such a vocabulary is refused for it (T5's vocabularies have <pad> at 0).
"""

from __future__ import annotations

from typing import Any, Mapping

from t5x_lite.data.task_access import FEATURE_CONVERTERS
from t5x_lite.data.vocab import tokenizer_files
from t5x_lite.errors import TaskDataError
from t5x_lite.tf_setup import import_tensorflow

tf = import_tensorflow()  # first, so that seqio finds it quiet and off the GPUs

import seqio  # noqa: E402

_TOKEN_FEATURES = ("inputs", "targets")  # the task features that hold token ids


def shift_up(example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """The task features' ids raised by one (so 0 is left to the padding seqio adds)."""
    return {k: v + 1 if k in _TOKEN_FEATURES else v for k, v in example.items()}


def shift_down(features: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """The model features' ids lowered by one where they hold tokens; padding stays 0.

    A decoder input holds a token exactly where its target does (the target is the next token
    of the same example), so both are lowered where the target is not padding.
    """
    out = dict(features)
    real = tf.not_equal(features["decoder_target_tokens"], 0)
    for k in ("decoder_target_tokens", "decoder_input_tokens"):
        out[k] = tf.where(real, features[k] - 1, tf.zeros_like(features[k]))
    if "encoder_input_tokens" in features:
        tokens = features["encoder_input_tokens"]
        out["encoder_input_tokens"] = tf.where(tf.not_equal(tokens, 0), tokens - 1, tf.zeros_like(tokens))
    return out


class _TokenZeroSafe:
    """Mixed into a seqio converter: ids one up through its conversion, then back (module docstring)."""

    def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        ds = ds.map(shift_up, num_parallel_calls=tf.data.AUTOTUNE)
        ds = super()._convert_features(ds, task_feature_lengths)  # type: ignore[misc]
        return ds.map(shift_down, num_parallel_calls=tf.data.AUTOTUNE)


class TokenZeroSafeLMFeatureConverter(_TokenZeroSafe, seqio.LMFeatureConverter):
    """seqio.LMFeatureConverter for a vocabulary whose id 0 is a real token (give it bos_id + 1)."""


class TokenZeroSafePrefixLMFeatureConverter(_TokenZeroSafe, seqio.PrefixLMFeatureConverter):
    """seqio.PrefixLMFeatureConverter for a vocabulary whose id 0 is a real token (give it bos_id + 1)."""


_TOKEN_ZERO_SAFE = {"LMFeatureConverter": TokenZeroSafeLMFeatureConverter,
                    "PrefixLMFeatureConverter": TokenZeroSafePrefixLMFeatureConverter}


def feature_converter(name: str, *, pack: bool, vocabulary: Any) -> seqio.FeatureConverter:
    """The feature converter `name` (task_access.FEATURE_CONVERTERS) for a task whose targets use `vocabulary`."""
    class_name, one_stream = FEATURE_CONVERTERS[name]
    start = tokenizer_files.decoder_start_id(vocabulary) if one_stream else 0
    if not tokenizer_files.zero_is_token(vocabulary):
        return getattr(seqio, class_name)(pack=pack, bos_id=start)
    if class_name not in _TOKEN_ZERO_SAFE:
        raise TaskDataError(f"The {name!r} feature converter feeds an encoder-decoder, which takes token 0 for "
                            f"padding, but token 0 is a real token of {vocabulary}. Use a vocabulary whose id 0 "
                            "is padding (T5's) for an encoder-decoder.")
    return _TOKEN_ZERO_SAFE[class_name](pack=pack, bos_id=start + 1)
