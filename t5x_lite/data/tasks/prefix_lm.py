"""Prefix-LM tasks over directories written by `t5x-lite prepare` (t5's `prefix_lm` objective).

Documents are split into pieces of min(inputs, targets) - 2 tokens (t5's `split_tokens`; a
document's last piece may be shorter); each piece is cut at a uniformly random point into a
non-empty prefix, the `inputs`, and the rest, the `targets` (t5's `denoise` with
`random_prefix_noise_mask`); both get EOS. Unlike t5's `prefix_lm`, no random chunk of a long document is dropped first, so
an epoch reads every token once. The same examples train both families: the encoder-decoder
through the 'enc_dec' feature converter, the decoder-only model through 'prefix_lm'.
"""

from __future__ import annotations

import functools

from t5x_lite import storage
from t5x_lite.data.tasks.lm import register_prepared_task
from t5x_lite.tf_setup import import_tensorflow

import_tensorflow()

import seqio  # noqa: E402
from t5.data import preprocessors as t5_preprocessors  # noqa: E402


def split_to_pieces(dataset, sequence_length: dict[str, int]):
    """Splits token sequences into pieces whose every prefix/targets split fits both lengths.

    A piece of n tokens becomes inputs of p + 1 and targets of n - p + 1 tokens (EOS included)
    with 1 <= p <= n - 1, so both fit whenever n <= min(inputs, targets). Pieces of two fewer
    tokens make each example, EOS included, exactly min(inputs, targets) long: with the
    'prefix_lm' converter's default inputs = targets = half the decoder row, two examples
    fill a row exactly.
    """
    piece = min(sequence_length["inputs"], sequence_length["targets"]) - 2
    if piece < 1:
        raise ValueError(f"Prefix-LM examples need inputs and targets lengths of at least 3, not "
                         f"{sequence_length}.")
    return t5_preprocessors.split_tokens(dataset, max_tokens_per_segment=piece)


# The prefix is the "noise" of t5's denoise: at noise_density 0.5 its length is uniform in
# [1, n - 1]; inputs keep the noise tokens, targets the others.
split_at_random_prefix = functools.partial(
    t5_preprocessors.denoise, noise_density=0.5, noise_mask_fn=t5_preprocessors.random_prefix_noise_mask,
    inputs_fn=t5_preprocessors.drop_nonnoise_tokens, targets_fn=t5_preprocessors.drop_noise_tokens)


def register_prefix_lm_task(name: str, data_dir: str) -> seqio.Task:
    """Registers (or re-registers) a prefix-LM task `name` over a prepared directory."""
    return register_prepared_task(
        name, data_dir, features=("inputs", "targets"),
        preprocessors=[split_to_pieces, split_at_random_prefix, seqio.preprocessors.append_eos_after_trim],
    )


@functools.cache
def _registered(name: str, data_dir: str) -> str:
    register_prefix_lm_task(name, data_dir)
    return name


def prefix_lm_task(*, name: str, data_dir: str) -> str:
    """Registers the prefix-LM task `name` over `data_dir` once and returns its name (for gin)."""
    return _registered(name, storage.absolute(data_dir))
