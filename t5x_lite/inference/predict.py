"""Predictions and scores of a restored model, for any family: what eval and infer call.

`predict` turns prompts (token ids) into generated token ids with the configured decoding
method; `score` gives the log-likelihood of targets given inputs. Both run the family's own
batches and programs (`BaseModel.decode_call`, `score_call`) through inference/decoding.py: a
causal LM reads a prompt as a prefix (the way a prefix LM is trained: inputs then targets); an
encoder-decoder encodes the inputs and decodes the targets.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from t5x_lite.errors import ConfigValueError
from t5x_lite.inference import decoding, scoring
from t5x_lite.models import BaseModel
from t5x_lite.models.generation import PAD_ID, STOPPED, check_sampling, sampling_settings, until_eos
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
        check_sampling(self.temperature, self.top_k, self.top_p, prefix="DecodingConfig.")


def check_prompt_lengths(model: BaseModel, prompts: Sequence[Sequence[int]], *, what: str,
                         first_index: int = 0) -> None:
    """Each prompt must leave room for one new token (the model's prompt-length rule); names the first that does not."""
    model.check_prompts(prompts, what=what, first_index=first_index, max_new_tokens=1)


def fit_prompt(model: BaseModel, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """The prompt's last tokens that fit the model's context with `max_new_tokens` new ones
    (at least its last token stays; an encoder-decoder's inputs are kept whole)."""
    return model.fit_prompt(prompt, max_new_tokens)


def predict(*, model: BaseModel, params: Any, prompts: Sequence[Sequence[int]], decoding_config: DecodingConfig,
            eos_id: int, batch_size: int | None = None, first_batch: int = 0,
            placement: Placement | None = None, bos_id: int = PAD_ID,
            zero_is_token: bool = False) -> list[list[int]]:
    """Generated token ids per prompt (EOS excluded), on every process.

    Prompts go `batch_size` at a time (all at once when None) through the placement's mesh,
    each batch's rows split over its devices and processes; every process keeps its own rows
    and they are combined once at the end. Batch b samples with fold_in(seed, first_batch + b).
    A causal LM reads `bos_id` first and may generate id 0 when `zero_is_token` (a Hugging Face
    tokenizer's: data/vocab/tokenizer_files.py `decoder_start_id`, `zero_is_token`).
    """
    cfg = decoding_config
    if cfg.method not in model.decoding_methods:
        raise ConfigValueError(f"DecodingConfig.method={cfg.method!r} does not decode a {model.family} model; use "
                               f"one of {list(model.decoding_methods)}.")
    if not prompts:
        return []
    model.check_prompts(prompts, max_new_tokens=0)
    placement = placement or placement_lib.of_params(params)
    zero_is_token = zero_is_token and model.continues_text
    sampled = cfg.method == "sample"
    sampling = sampling_settings(temperature=cfg.temperature if sampled else 0.0, top_k=cfg.top_k if sampled else 0,
                                 top_p=cfg.top_p if sampled else 1.0, zero_is_token=zero_is_token)
    width = max(1, decoding.new_token_limit(model, prompts, cfg.max_decode_length))  # no row makes more
    tokens = RowResults(placement, total=len(prompts), width=width, dtype=np.int32,
                        fill=STOPPED if zero_is_token else PAD_ID)
    for b, ids in enumerate(placement_lib.batch_schedule(len(prompts), batch_size or len(prompts), placement)):
        rows = [prompts[i] if i >= 0 else None for i in ids]
        rng = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), first_batch + b)
        out, _ = decoding.decode_batch(model=model, params=params, rows=rows, method=cfg.method,
                                       max_new_tokens=cfg.max_decode_length, sampling=sampling, rng=rng,
                                       eos_id=eos_id, placement=placement, bos_id=bos_id, beam_size=cfg.beam_size,
                                       alpha=cfg.alpha)
        tokens.add(ids, out)
    return [until_eos(row, eos_id, zero_is_token=zero_is_token) for row in tokens.gather()]


def score(*, model: BaseModel, params: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
          batch_size: int, placement: Placement | None = None, bos_id: int = PAD_ID) -> list[float]:
    """Summed log-likelihood of each (inputs, targets) pair's targets given its inputs, on every process.

    A causal LM reads `bos_id`, then the inputs, then the targets, through scoring.py (its rows
    checked first, batched by length); any other family through its `score_call`."""
    if model.continues_text:
        results = scoring.continuation_logprobs(model=model, params=params, requests=pairs, batch_size=batch_size,
                                                placement=placement, bos_id=bos_id)
        return [logprob for logprob, _, _ in results]
    placement = placement or placement_lib.of_params(params)
    sums = RowResults(placement, total=len(pairs), width=1, dtype=np.float32)
    for ids in placement_lib.batch_schedule(len(pairs), batch_size, placement):
        chunk = [pairs[i if i >= 0 else ids[0]] for i in ids]  # a padding row repeats the first
        out = decoding.run(model.score_call(chunk, bos_id=bos_id), params=params, placement=placement)
        sums.add(ids, out[:, :1])
    return [float(s) for s in sums.gather()[:, 0]]
