"""Predictions and scores of a restored model, for either family: what eval and infer call.

`predict` turns prompts (token ids) into generated token ids with the configured decoding
method; `score` gives the log-likelihood of targets given inputs. The decoder-only model reads
a prompt as a prefix (the way a prefix LM is trained: inputs then targets); the encoder-decoder
encodes the inputs and decodes the targets.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from t5x_lite.errors import ConfigValueError
from t5x_lite.inference import decoding, scoring
from t5x_lite.models import ModelConfig
from t5x_lite.parallel import placement as placement_lib
from t5x_lite.parallel.placement import Placement, RowResults

METHODS = ("greedy", "sample", "beam")


@dataclasses.dataclass(frozen=True)
class DecodingConfig:
    """How to generate (bound in gin/runs/eval.gin and infer.gin).

    Attributes:
      method: 'greedy', 'sample' (temperature, top_k, top_p) or 'beam' (encoder-decoder only).
      max_decode_length: most new tokens per prompt (EOS ends a prompt's output earlier).
      temperature: sampling temperature ('sample' only).
      top_k: keep the k most likely tokens, 0 keeps all ('sample' only).
      top_p: keep the smallest set of tokens whose probability reaches top_p, 1 keeps all.
      beam_size: hypotheses kept per input ('beam' only).
      alpha: length penalty exponent ((5 + length) / 6) ** alpha ('beam' only; 0: none).
      seed: the sampling RNG's seed; batch i of a run uses fold_in(seed, i). Sampled outputs are the
        same on any mesh whose batch shards divide the batch size (the batches are then the same).
    """

    method: str = "greedy"
    max_decode_length: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    beam_size: int = 4
    alpha: float = 0.6
    seed: int = 0

    def __post_init__(self):
        if self.method not in METHODS:
            raise ConfigValueError(f"DecodingConfig.method={self.method!r}; choose one of {list(METHODS)}.")
        if self.max_decode_length < 1:
            raise ConfigValueError(f"DecodingConfig.max_decode_length={self.max_decode_length} must be at least 1.")


def check_prompt_lengths(model: ModelConfig, prompts: Sequence[Sequence[int]], *, what: str,
                         first_index: int = 0) -> None:
    """Each decoder-only prompt must leave room in max_len for BOS and one new token; names the first that does not."""
    if model.family != "decoder_only":
        return
    longest = model.max_len - 2
    for i, prompt in enumerate(prompts):
        if len(prompt) > longest:
            raise ConfigValueError(
                f"{what} {first_index + i} has {len(prompt)} tokens, but the model's context (max_len="
                f"{model.max_len}) holds at most {longest} prompt tokens (plus BOS and one new token); "
                "shorten or drop that prompt.")


def fit_prompt(model: ModelConfig, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """A decoder-only prompt keeps its last tokens so that BOS, it and `max_new_tokens` new tokens
    fit max_len (at least its last token stays); an encoder-decoder's inputs are kept whole."""
    if model.family != "decoder_only":
        return list(prompt)
    room = max(1, model.max_len - 1 - max_new_tokens)
    return list(prompt[-room:])


def predict(*, model: ModelConfig, params: Any, prompts: Sequence[Sequence[int]], decoding_config: DecodingConfig,
            eos_id: int, batch_size: int | None = None, first_batch: int = 0,
            placement: Placement | None = None, bos_id: int = decoding.PAD_ID,
            zero_is_token: bool = False) -> list[list[int]]:
    """Generated token ids per prompt (EOS excluded), on every process.

    Prompts go `batch_size` at a time (all at once when None) through the placement's mesh,
    each batch's rows split over its devices and processes; every process keeps its own rows
    and they are combined once at the end. Batch b samples with fold_in(seed, first_batch + b).
    A decoder-only model reads `bos_id` first and may generate id 0 when `zero_is_token` (a
    Hugging Face tokenizer's: data/tokenizer_files.py `decoder_start_id`, `zero_is_token`).
    """
    cfg = decoding_config
    if model.family == "decoder_only" and cfg.method == "beam":
        raise ConfigValueError("Beam search decodes encoder-decoder models; use method 'greedy' or 'sample' "
                               "for a decoder-only model.")
    if not prompts:
        return []
    if model.family == "decoder_only":
        decoding.check_lm_prompts(model, prompts)
    placement = placement or placement_lib.of_params(params)
    zero_is_token = zero_is_token and model.family == "decoder_only"
    sampling = decoding.sampling_settings(
        temperature=cfg.temperature if cfg.method == "sample" else 0.0, top_k=cfg.top_k if cfg.method == "sample" else 0,
        top_p=cfg.top_p if cfg.method == "sample" else 1.0, zero_is_token=zero_is_token)
    tokens = RowResults(placement, total=len(prompts), width=cfg.max_decode_length, dtype=np.int32,
                        fill=decoding.STOPPED if zero_is_token else decoding.PAD_ID)
    for b, ids in enumerate(placement_lib.batch_schedule(len(prompts), batch_size or len(prompts), placement)):
        rows = [prompts[i] if i >= 0 else None for i in ids]
        rng = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), first_batch + b)
        if model.family == "decoder_only":
            out = decoding.lm_batch(model=model, params=params, prompts=rows, max_new_tokens=cfg.max_decode_length,
                                    rng=rng, sampling=sampling, eos_id=eos_id, use_cache=True, placement=placement,
                                    bos_id=bos_id)
        elif cfg.method == "beam":
            out, _ = decoding.beam_batch(model=model, params=params, inputs=rows,
                                         max_decode_length=cfg.max_decode_length, beam_size=cfg.beam_size,
                                         alpha=cfg.alpha, eos_id=eos_id, placement=placement)
        else:
            out = decoding.seq2seq_batch(model=model, params=params, inputs=rows,
                                         max_decode_length=cfg.max_decode_length, rng=rng, sampling=sampling,
                                         eos_id=eos_id, use_cache=True, placement=placement)
        tokens.add(ids, out)
    return [decoding.until_eos(row, eos_id, zero_is_token=zero_is_token) for row in tokens.gather()]


def score(*, model: ModelConfig, params: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
          batch_size: int, placement: Placement | None = None, bos_id: int = scoring.BOS_ID) -> list[float]:
    """Summed log-likelihood of each (inputs, targets) pair's targets given its inputs, on every process
    (a decoder-only model reads `bos_id` first)."""
    if model.family == "decoder_only":
        results = scoring.continuation_logprobs(model=model, params=params, requests=pairs, batch_size=batch_size,
                                                placement=placement, bos_id=bos_id)
        return [logprob for logprob, _, _ in results]
    placement = placement or placement_lib.of_params(params)
    sums = RowResults(placement, total=len(pairs), width=1, dtype=np.float32)
    for ids in placement_lib.batch_schedule(len(pairs), batch_size, placement):
        chunk = [pairs[i if i >= 0 else ids[0]] for i in ids]  # a padding row repeats the first
        inputs, targets = _pad([p[0] for p in chunk]), _pad([p[1] for p in chunk])
        with placement.context():
            sums.add(ids, _seq2seq_target_logprob(model, params, placement.put(inputs), placement.put(targets)))
    return [float(s) for s in sums.gather()[:, 0]]


def _pad(sequences: Sequence[Sequence[int]]) -> np.ndarray:
    """[rows, length] int32, zero-padded; the length rounded up to a multiple of 16 to limit recompiles."""
    length = max(16, -(-max(len(s) for s in sequences) // 16) * 16)
    out = np.zeros((len(sequences), length), np.int32)
    for i, s in enumerate(sequences):
        out[i, :len(s)] = s
    return out


@partial(jax.jit, static_argnames="model")
def _seq2seq_target_logprob(model: ModelConfig, params: Any, inputs: jax.Array, targets: jax.Array) -> jax.Array:
    """[batch, 1]: per row, the sum of log p(target token) for an encoder-decoder; padding (id 0) is not scored."""
    decoder_inputs = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]  # shift right: BOS = 0
    logits = model.make_module().apply({"params": params}, encoder_input_tokens=inputs,
                                       decoder_input_tokens=decoder_inputs)
    logprobs = jax.nn.log_softmax(logits.astype(jnp.float32))
    picked = jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
    sums = jnp.sum(jnp.where(targets > 0, picked, 0.0), axis=-1, keepdims=True)
    return nn.with_logical_constraint(sums, ("batch", None))
