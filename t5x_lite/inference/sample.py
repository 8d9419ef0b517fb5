"""`t5x-lite sample --model_dir=DIR --prompt=TEXT`: generate text from a trained checkpoint.

`sample_texts` is also what the train loop prints at each evaluation (training/hooks.py), with
the same defaults: a run's "step N samples (seed S)" are what `t5x-lite sample --step=N
--seed=S` prints for the same prompt. A causal LM continues each prompt; an encoder-decoder reads
it as its inputs, encoded as `infer` encodes a prompts file's (inference/prompts.py: EOS last), and
writes its outputs.

Reads everything from the model directory (the checkpoint's metadata gives the model's
sizes, vocab/spm.model the vocabulary), so no gin file is needed.
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

import jax

from t5x_lite import errors, host_memory
from t5x_lite.checkpoints import restored_model
from t5x_lite.data.vocab import tokenizer_files
from t5x_lite.errors import ConfigValueError
from t5x_lite.inference import decoding
from t5x_lite.inference import prompts as prompts_lib
from t5x_lite.models import BaseModel
from t5x_lite.models.generation import check_sampling
from t5x_lite.parallel.placement import Placement


def prompt_list(prompts: str | Sequence[str] | None) -> list[str]:
    """`train.sample_prompt` as a list: one prompt, several, or none."""
    return [prompts] if isinstance(prompts, str) else list(prompts or ())


def encode_prompts(vocabulary: Any, prompts: Sequence[str], model: BaseModel | None = None) -> list[list[int]]:
    """The prompts' token ids as `sample_texts` feeds them to `model`, encoded as infer encodes a prompt
    (prompts.encode_prompt); a causal LM's (and any, when `model` is None) with their trailing spaces
    left for the model to write."""
    if model is None:
        return [list(vocabulary.encode(p.rstrip(" "))) for p in prompts]
    return [prompts_lib.encode_prompt(model, vocabulary, p.rstrip(" ") if model.continues_text else p)
            for p in prompts]


def sample_tokens(*, model: BaseModel, params: Any, vocabulary: Any, prompts: Sequence[str],
                  max_new_tokens: int, seed: int = 0, temperature: float = 0.8, top_k: int = 40,
                  top_p: float = 1.0, placement: Placement | None = None) -> tuple[list[list[int]], list[list[int]]]:
    """(each prompt's ids, its sampled new ids, EOS excluded): one KV-cached batch (temperature 0: greedy)."""
    encoded = encode_prompts(vocabulary, prompts, model)
    tokens = decoding.generate_batch(
        model=model, params=params, prompts=encoded, max_new_tokens=max_new_tokens, rng=jax.random.PRNGKey(seed),
        temperature=temperature, top_k=top_k, top_p=top_p, eos_id=vocabulary.eos_id, placement=placement,
        bos_id=tokenizer_files.decoder_start_id(vocabulary), zero_is_token=tokenizer_files.zero_is_token(vocabulary))
    return encoded, tokens


def sample_texts(*, model: BaseModel, params: Any, vocabulary: Any, prompts: Sequence[str],
                 max_new_tokens: int, seed: int = 0, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 1.0, placement: Placement | None = None) -> list[str]:
    """Each prompt followed by its sampled continuation, as text (one KV-cached batch); an
    encoder-decoder's output alone.

    Spaces that end a causal LM's prompt are left for the model to write: SentencePiece and
    byte-level BPE vocabularies attach a space to the word after it, so a prompt's trailing space
    would become a lone space token, which the training text puts almost only before numbers.
    """
    encoded, tokens = sample_tokens(model=model, params=params, vocabulary=vocabulary, prompts=prompts,
                                    max_new_tokens=max_new_tokens, seed=seed, temperature=temperature, top_k=top_k,
                                    top_p=top_p, placement=placement)
    if not model.continues_text:
        return [vocabulary.decode(new) for new in tokens]
    return [vocabulary.decode(prompt + new) for prompt, new in zip(encoded, tokens)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="t5x-lite sample", description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True, help="a model directory written by `t5x-lite train`")
    parser.add_argument("--prompt", action="append", help="text to continue (an encoder-decoder's inputs); repeat "
                        "the flag for several prompts, sampled as one batch as during training (default: an empty "
                        "prompt)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    parser.add_argument("--max_new_tokens", type=int, default=128,
                        help="at most this many new tokens (fewer when the model's max_len is reached)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 means greedy")
    parser.add_argument("--top_k", type=int, default=40, help="0 disables top-k filtering")
    parser.add_argument("--top_p", type=float, default=1.0, help="in (0, 1]; 1 disables nucleus filtering")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with errors.reported():
        if args.max_new_tokens < 1:
            raise ConfigValueError(f"--max_new_tokens={args.max_new_tokens} must be at least 1 (generation also "
                                   "stops at EOS and when the model's context is full).")
        check_sampling(args.temperature, args.top_k, args.top_p, prefix="--")
        restored = restored_model.restore(args.model_dir, step=args.step)
        prompts = args.prompt or [""]
        texts = sample_texts(model=restored.config, params=restored.params, vocabulary=restored.vocabulary(),
                             prompts=prompts, max_new_tokens=args.max_new_tokens, seed=args.seed,
                             temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                             placement=restored.placement)
        if len(prompts) == 1:
            print(f"[step {restored.step}]\n{texts[0]}")
        else:
            print(f"[step {restored.step}]" + "".join(f"\n--- {p!r}\n{t}" for p, t in zip(prompts, texts)))
    return 0


if __name__ == "__main__":
    host_memory.run_program(main)
