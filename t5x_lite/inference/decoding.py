"""Decoding's front door: generation for any model family, on a placement.

A family lays one batch out as host arrays and names the jitted program that generates from
them (`BaseModel.decode_call`; the programs are in models/*_generation.py). Here the batch is
padded to the placement's batch shards, its rows are split over the mesh's batch axes (the
params stay sharded as the placement put them), the program runs, and every process gets
every row's output (`RowResults`). Without a placement, everything runs on this process's
first device.

Every entry here checks prompts with the model's one prompt-length rule
(`BaseModel.check_prompts`), which raises the package's user error naming the prompt.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from t5x_lite.models import BaseModel
from t5x_lite.models.generation import PAD_ID, STOPPED, DecodeCall, sampling_settings, until_eos
from t5x_lite.parallel import placement as placement_lib
from t5x_lite.parallel.placement import Placement, RowResults

Array = jax.Array


def run(call: DecodeCall, *, params: Any, placement: Placement) -> Any:
    """Runs a family's batch on the placement: its rows split over the batch axes, its shared values whole."""
    if call.program is None:
        return call.result
    with placement.context():
        return call.program(params, *(placement.put(a) for a in call.rows),
                            *(placement.replicated(v) for v in call.shared), **call.static)


def padded(items: Sequence[Any], placement: Placement) -> tuple[list[Any], list[int]]:
    """The items with None rows added up to the placement's batch shards, and the row ids (-1: padding)."""
    rows = placement.padded_rows(len(items))
    return list(items) + [None] * (rows - len(items)), list(range(len(items))) + [-1] * (rows - len(items))


def decode_batch(*, model: BaseModel, params: Any, rows: Sequence[Sequence[int] | None], method: str,
                 max_new_tokens: int, sampling: tuple, rng: Array, eos_id: int, placement: Placement,
                 bos_id: int = PAD_ID, use_cache: bool = True, beam_size: int = 4,
                 alpha: float = 0.6) -> tuple[Any, Any]:
    """(tokens [rows, width], scores [rows, 1]) of one batch (None: a padding row), split by rows."""
    call = model.decode_call(rows, method=method, max_new_tokens=max_new_tokens, sampling=sampling, rng=rng,
                             eos_id=eos_id, bos_id=bos_id, use_cache=use_cache, beam_size=beam_size, alpha=alpha)
    return run(call, params=params, placement=placement)


def new_token_limit(model: BaseModel, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> int:
    """`max_new_tokens`, capped at the room the model's context leaves after the shortest prompt (the
    prompt-length rule, `max_prompt_tokens(0)` less the prompt): no row generates more, so buffers sized
    by it stay small whatever was asked. An encoder-decoder's outputs have no such cap."""
    longest = model.max_prompt_tokens(0)
    if longest is None or not prompts:
        return max_new_tokens
    return max(0, min(max_new_tokens, longest - min(len(p) for p in prompts)))


def generate_rows(*, model: BaseModel, params: Any, prompts: Sequence[Sequence[int]], method: str,
                  max_new_tokens: int, rng: Array, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                  eos_id: int = 1, bos_id: int = PAD_ID, zero_is_token: bool = False, use_cache: bool = True,
                  beam_size: int = 4, alpha: float = 0.6,
                  placement: Placement | None = None) -> list[tuple[list[int], float]]:
    """Every prompt as one batch: each output (EOS excluded) and its score (beam search's; else 0)."""
    if not prompts:
        return []
    model.check_prompts(prompts, max_new_tokens=0)
    max_new_tokens = new_token_limit(model, prompts, max_new_tokens)
    placement = placement or placement_lib.of_params(params)
    rows, ids = padded(prompts, placement)
    sampling = sampling_settings(temperature, top_k, top_p, zero_is_token=zero_is_token)
    tokens, scores = decode_batch(model=model, params=params, rows=rows, method=method,
                                  max_new_tokens=max_new_tokens, sampling=sampling, rng=rng, eos_id=eos_id,
                                  placement=placement, bos_id=bos_id, use_cache=use_cache, beam_size=beam_size,
                                  alpha=alpha)
    fill = STOPPED if zero_is_token else PAD_ID
    token_rows = RowResults(placement, total=len(prompts), width=max(1, max_new_tokens), dtype=np.int32, fill=fill)
    score_rows = RowResults(placement, total=len(prompts), width=1, dtype=np.float32)
    token_rows.add(ids, tokens)
    score_rows.add(ids, scores, count=False)
    return [(until_eos(row, eos_id, zero_is_token=zero_is_token), float(score[0]))
            for row, score in zip(token_rows.gather(), score_rows.gather())]


def generate_batch(*, model: BaseModel, params: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                   rng: Array, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, eos_id: int = 1,
                   use_cache: bool = True, placement: Placement | None = None, bos_id: int = PAD_ID,
                   zero_is_token: bool = False) -> list[list[int]]:
    """Greedy (temperature 0) or top-k / top-p sampled continuations of every prompt, EOS excluded.

    A decoder-only row stops at its own EOS, after `max_new_tokens`, or when BOS + prompt + new
    tokens fill `model.max_len`; an empty prompt continues from BOS alone. `bos_id` is the
    model's first token and `zero_is_token` lets id 0 be generated: a Hugging Face tokenizer's
    (data/vocab/tokenizer_files.py `decoder_start_id`, `zero_is_token`).
    """
    method = "greedy" if temperature == 0.0 else "sample"
    return [tokens for tokens, _ in generate_rows(
        model=model, params=params, prompts=prompts, method=method, max_new_tokens=max_new_tokens, rng=rng,
        temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos_id, bos_id=bos_id,
        zero_is_token=zero_is_token, use_cache=use_cache, placement=placement)]


def generate_seq2seq(*, model: BaseModel, params: Any, inputs: Sequence[Sequence[int]], max_decode_length: int,
                     rng: Array, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, eos_id: int = 1,
                     use_cache: bool = True, placement: Placement | None = None) -> list[list[int]]:
    """Greedy (temperature 0) or sampled outputs of an encoder-decoder, EOS excluded, one per input;
    each stops at its EOS or after `max_decode_length` tokens."""
    return generate_batch(model=model, params=params, prompts=inputs, max_new_tokens=max_decode_length, rng=rng,
                          temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos_id, use_cache=use_cache,
                          placement=placement)


def beam_search_with_scores(*, model: BaseModel, params: Any, inputs: Sequence[Sequence[int]],
                            max_decode_length: int, beam_size: int = 4, alpha: float = 0.6,
                            eos_id: int = 1, placement: Placement | None = None) -> list[tuple[list[int], float]]:
    """The best beam-search hypothesis per input (EOS excluded) and its score.

    The score is log p(tokens + EOS) / brevity_penalty(alpha, len(tokens) + 1) for a finished
    hypothesis; an input with none finished gets its best unfinished one, scored
    log p(tokens) / brevity_penalty(alpha, max_decode_length).
    """
    if max_decode_length < 1 or beam_size < 1:
        raise ValueError(f"max_decode_length={max_decode_length} and beam_size={beam_size} must be at least 1.")
    return generate_rows(model=model, params=params, prompts=inputs, method="beam", max_new_tokens=max_decode_length,
                         rng=jax.random.PRNGKey(0), eos_id=eos_id, beam_size=beam_size, alpha=alpha,
                         placement=placement)


def beam_search(*, model: BaseModel, params: Any, inputs: Sequence[Sequence[int]], max_decode_length: int,
                beam_size: int = 4, alpha: float = 0.6, eos_id: int = 1,
                placement: Placement | None = None) -> list[list[int]]:
    """The best beam-search output per input, EOS excluded (see beam_search_with_scores)."""
    return [tokens for tokens, _ in beam_search_with_scores(model=model, params=params, inputs=inputs,
                                                            max_decode_length=max_decode_length, beam_size=beam_size,
                                                            alpha=alpha, eos_id=eos_id, placement=placement)]
