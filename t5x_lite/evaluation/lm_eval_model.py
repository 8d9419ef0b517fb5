"""lm-evaluation-harness's model `t5x_lite`: a checkpoint scored and decoded by the project's own functions.

Importing this module registers the model with lm-eval (`lm_eval.api.registry.register_model`);
lm-eval 0.4.13 finds no model outside its own package otherwise. `t5x-lite lm-eval`
(lm_eval_command.py) imports it and runs lm-eval's command line; from Python:

    import lm_eval, t5x_lite.evaluation.lm_eval_model
    lm_eval.simple_evaluate(model="t5x_lite", model_args="model_dir=runs/quickstart", tasks=[...])

model_args: model_dir (required), step (default: the latest good one), batch_size (rows per
model call, default 8; lm-eval's own --batch_size when model_args has none), max_gen_toks (new
tokens of generate_until when a task sets none, default 256), seed (of sampled generation, default 0).

The request types, on our side (docs/eval.md, "lm-evaluation-harness"):
  loglikelihood         context and continuation encoded separately. Decoder-only:
                        inference/scoring.py continuation_logprobs (after BOS). T5: predict.score of
                        the continuation (no EOS) given context + EOS; is_greedy from a greedy decode.
  loglikelihood_rolling decoder-only: perplexity.py's disjoint windows of max_len tokens, each scored
                        from BOS; T5: the whole document as the target of an input of EOS alone.
  generate_until        predict.predict (greedy, or sampled with do_sample), cut before the first
                        until-string; EOS ends decoding. A long decoder-only prompt keeps its last tokens.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable, Mapping, Sequence

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from t5x_lite.checkpoints import restored_model
from t5x_lite.data.vocab import tokenizer_files
from t5x_lite.errors import UserError
from t5x_lite.evaluation import perplexity as perplexity_eval
from t5x_lite.inference import predict, scoring
from t5x_lite.inference import prompts as prompts_lib
from t5x_lite.models.generation import LENGTH_BUCKET

logger = logging.getLogger("lm_eval.t5x_lite")  # shown with lm-eval's own log lines

DEFAULT_BATCH_SIZE = 8
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's own default for its Hugging Face models
# Passed by lm-eval to every model; the mesh (checkpoints/restored_model.py) decides where we run.
IGNORED_ARGS = ("device", "max_batch_size")
# gen_kwargs that generate_until reads; others are ignored with a warning.
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p")


class LmEvalArgumentError(UserError, ValueError):
    """A model_arg of the `t5x_lite` lm-eval model is missing or invalid."""


@dataclasses.dataclass(frozen=True)
class ModelArgs:
    """The `t5x_lite` model's model_args, typed."""

    model_dir: str
    step: int | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    max_gen_toks: int = DEFAULT_MAX_GEN_TOKS
    seed: int = 0


def _integer(name: str, value: Any, *, minimum: int | None = None, what: str = "model_args") -> int:
    """An integer model_arg (or gen_kwarg): lm-eval hands them over as strings or already converted."""
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise LmEvalArgumentError(f"{what} {name}={value!r} must be an integer.")
    if minimum is not None and value < minimum:
        raise LmEvalArgumentError(f"{what} {name}={value} must be at least {minimum}.")
    return value


def parse_model_args(args: Mapping[str, Any]) -> ModelArgs:
    """Typed model_args, or one LmEvalArgumentError naming the bad one."""
    fields = [f.name for f in dataclasses.fields(ModelArgs)]
    unknown = sorted(set(args) - set(fields) - set(IGNORED_ARGS))
    if unknown:
        raise LmEvalArgumentError(f"unknown model_args {', '.join(unknown)} of the t5x_lite model; it takes "
                                  f"{', '.join(fields)} (e.g. --model_args model_dir=runs/quickstart,step=300).")
    model_dir = args.get("model_dir")
    if model_dir is None or not str(model_dir).strip():
        raise LmEvalArgumentError("the t5x_lite model needs a model directory: --model_args model_dir=DIR "
                                  "(a directory that training wrote checkpoints to).")
    step = args.get("step")
    step = None if step in (None, "", "latest") else _integer("step", step, minimum=0)
    batch_size = args.get("batch_size")
    if batch_size is None or str(batch_size).startswith("auto"):  # lm-eval's "auto[:N]": our default
        batch_size = DEFAULT_BATCH_SIZE
    return ModelArgs(model_dir=str(model_dir), step=step, batch_size=_integer("batch_size", batch_size, minimum=1),
                     max_gen_toks=_integer("max_gen_toks", args.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS), minimum=1),
                     seed=_integer("seed", args.get("seed", 0)))


def cut_at_stop(text: str, until: Sequence[str]) -> str:
    """`text` up to (not including) the first occurrence of any of the `until` strings."""
    ends = [text.find(stop) for stop in until if stop and stop in text]
    return text[:min(ends)] if ends else text


def _in_length_order(items: Sequence[Any], length: Callable[[Any], int], run: Callable[[list], list]) -> list:
    """`run` over the items longest first (batches of similar length pad little); results in the items' order."""
    order = sorted(range(len(items)), key=lambda i: length(items[i]), reverse=True)
    results = [None] * len(items)
    for i, result in zip(order, run([items[i] for i in order])):
        results[i] = result
    return results


@register_model("t5x_lite")
class T5xLiteLM(LM):
    """A t5x_lite checkpoint (decoder-only or T5) as an lm-evaluation-harness model."""

    def __init__(self, **model_args: Any):
        super().__init__()
        self.args = parse_model_args(model_args)
        self.restored = restored_model.restore(self.args.model_dir, step=self.args.step)
        self.config, self.params = self.restored.config, self.restored.params
        self.placement = self.restored.placement
        self.vocabulary = self.restored.vocabulary()
        self.decoder_only = self.config.continues_text  # a causal LM: continuations scored after BOS
        self.eos_id = self.vocabulary.eos_id
        # A decoder-only model's first token (a Hugging Face tokenizer's BOS, else EOS; seqio's: 0) and
        # whether id 0 is a real token it may generate (data/vocab/tokenizer_files.py).
        self.bos_id = tokenizer_files.decoder_start_id(self.vocabulary)
        self.zero_is_token = tokenizer_files.zero_is_token(self.vocabulary)
        if self.eos_id is None and not self.decoder_only:
            raise LmEvalArgumentError(f"{self.restored.model_dir}'s vocabulary has no EOS id, which the inputs of an "
                                      "encoder-decoder end with.")
        self._batches_sampled = 0
        self._warned: set[tuple[str, ...]] = set()
        logger.info("t5x_lite: step %d of %s (%s), %s, batch_size %d", self.restored.step, self.restored.model_dir,
                    self.config.family, self.placement.describe(), self.args.batch_size)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> T5xLiteLM:
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: Mapping[str, Any], additional_config: dict | None = None) -> T5xLiteLM:
        """lm-eval's batch_size (its --batch_size, which its command line always sets) counts only when
        model_args has none; its device and max_batch_size are ignored (the mesh decides)."""
        args = dict(arg_dict)
        batch_size = (additional_config or {}).get("batch_size")
        if batch_size is not None and "batch_size" not in args:
            args["batch_size"] = batch_size
        return cls(**args)

    @property
    def tokenizer_name(self) -> str:
        return f"t5x_lite:{self.restored.model_dir}"

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.vocabulary.encode(text)] if text else []

    # --- loglikelihood ---------------------------------------------------------------------------

    def loglikelihood(self, requests: list) -> list[tuple[float, bool]]:
        """(log p(continuation | context), is_greedy) per request; context and continuation encoded apart."""
        pairs = [(self.encode(context), self.encode(continuation)) for context, continuation in
                 (request.args for request in requests)]
        results = self.loglikelihood_tokens(pairs)
        for request, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", request.args, result)
        return results

    def loglikelihood_tokens(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[tuple[float, bool]]:
        """`loglikelihood` of (context ids, continuation ids) pairs; an empty continuation is (0.0, True)."""
        results: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
        scored = [i for i, (_, continuation) in enumerate(pairs) if continuation]
        if not scored:
            return results
        if self.decoder_only:
            out = scoring.continuation_logprobs(model=self.config, params=self.params,
                                                requests=[pairs[i] for i in scored], batch_size=self.args.batch_size,
                                                placement=self.placement, bos_id=self.bos_id)
            for i, (logprob, _, greedy) in zip(scored, out):
                results[i] = (logprob, greedy)
            return results
        encoded = [([*pairs[i][0], self.eos_id], list(pairs[i][1])) for i in scored]
        logprobs = self._t5_score(encoded)
        greedy = self._t5_is_greedy(encoded)
        for i, logprob, is_greedy in zip(scored, logprobs, greedy):
            results[i] = (logprob, is_greedy)
        return results

    def _t5_score(self, pairs: list[tuple[list[int], list[int]]]) -> list[float]:
        """log p(targets | inputs) per (inputs, targets) pair of the encoder-decoder."""
        return _in_length_order(pairs, lambda p: len(p[0]) + len(p[1]), lambda chunk: predict.score(
            model=self.config, params=self.params, pairs=chunk, batch_size=self.args.batch_size,
            placement=self.placement))

    def _t5_is_greedy(self, pairs: list[tuple[list[int], list[int]]]) -> list[bool]:
        """Whether greedy decoding from each pair's inputs yields its targets: one decode per distinct input
        (the choices of a multiple-choice question share it), of the longest target's length (bucketed)."""
        inputs = sorted({tuple(x) for x, _ in pairs}, key=len, reverse=True)
        longest = max(len(t) for _, t in pairs)
        length = -(-longest // LENGTH_BUCKET) * LENGTH_BUCKET
        outputs = predict.predict(model=self.config, params=self.params, prompts=[list(x) for x in inputs],
                                  decoding_config=predict.DecodingConfig(method="greedy", max_decode_length=length),
                                  eos_id=self.eos_id, batch_size=self.args.batch_size, placement=self.placement)
        greedy = dict(zip(inputs, outputs))
        return [greedy[tuple(x)][:len(t)] == list(t) for x, t in pairs]

    # --- loglikelihood_rolling ------------------------------------------------------------------

    def loglikelihood_rolling(self, requests: list) -> list[float]:
        """The log-likelihood of each whole document (args: (text,))."""
        documents = [self.encode(text) for (text,) in (request.args for request in requests)]
        results = self.rolling_tokens(documents)
        for request, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, result)
        return results

    def rolling_tokens(self, documents: Sequence[Sequence[int]]) -> list[float]:
        """`loglikelihood_rolling` of token-id documents; an empty document is 0.0.

        Decoder-only: perplexity.py's disjoint windows of max_len tokens (stride = context =
        max_len), each scored from BOS, so the sum equals -loss * tokens of `perplexity` with that
        context and stride. T5: each document is the target of an input of EOS alone, in one piece.
        """
        if not self.decoder_only:
            scored = [i for i, d in enumerate(documents) if d]
            totals = [0.0] * len(documents)
            for i, logprob in zip(scored, self._t5_score([([self.eos_id], list(documents[i])) for i in scored])):
                totals[i] = logprob
            return totals
        rows, owners = [], []
        for d, document in enumerate(documents):
            window_rows = perplexity_eval.document_rows(document, context_length=self.config.max_len,
                                                        stride=self.config.max_len, bos_id=self.bos_id)
            rows += window_rows
            owners += [d] * len(window_rows)
        per_document: list[list[float]] = [[] for _ in documents]
        if rows:
            results = scoring.score_rows(self.config, self.params, rows, self.args.batch_size, self.placement)
            for d, (logprob, _, _) in zip(owners, results):
                per_document[d].append(logprob)
        return [math.fsum(values) for values in per_document]

    # --- generate_until -------------------------------------------------------------------------

    def decoding_config(self, gen_kwargs: Mapping[str, Any] | None) -> tuple[predict.DecodingConfig, tuple[str, ...]]:
        """The DecodingConfig and until-strings of one request's gen_kwargs."""
        kwargs = dict(gen_kwargs or {})
        ignored = tuple(sorted(set(kwargs) - set(GEN_KWARGS)))
        if ignored and ignored not in self._warned:
            self._warned.add(ignored)
            logger.warning("t5x_lite: gen_kwargs %s are ignored (generate_until reads %s).", list(ignored),
                           list(GEN_KWARGS))
        until = kwargs.get("until") or ()
        until = (until,) if isinstance(until, str) else tuple(u for u in until if u)
        max_gen_toks = _integer("max_gen_toks", kwargs.get("max_gen_toks") or self.args.max_gen_toks, minimum=1,
                                what="gen_kwargs")
        temperature = float(kwargs.get("temperature") if kwargs.get("temperature") is not None else 1.0)
        sample = bool(kwargs.get("do_sample")) and temperature > 0
        if not sample:
            return predict.DecodingConfig(method="greedy", max_decode_length=max_gen_toks, seed=self.args.seed), until
        return predict.DecodingConfig(method="sample", max_decode_length=max_gen_toks, temperature=temperature,
                                      top_k=int(kwargs.get("top_k") or 0), top_p=float(kwargs.get("top_p") or 1.0),
                                      seed=self.args.seed), until

    def fit_prompt(self, prompt: list[int], max_gen_toks: int) -> list[int]:
        """A decoder-only prompt keeps its last tokens so that BOS, it and max_gen_toks new tokens fit
        max_len (at least its last token stays); an encoder-decoder's inputs gain EOS (inference/prompts.py)."""
        if prompts_lib.inputs_end_with_eos(self.config):
            return [*prompt, self.eos_id]
        return predict.fit_prompt(self.config, prompt, max_gen_toks)

    def generate_until(self, requests: list) -> list[str]:
        """Greedy (or sampled, with do_sample) continuations, each cut before its first until-string."""
        settings = [self.decoding_config(gen_kwargs) for _, gen_kwargs in (request.args for request in requests)]
        groups: dict[predict.DecodingConfig, list[int]] = {}
        for i, (config, _) in enumerate(settings):
            groups.setdefault(config, []).append(i)
        texts = [""] * len(requests)
        for config, indices in groups.items():
            prompts = [self.fit_prompt(self.encode(requests[i].args[0]), config.max_decode_length) for i in indices]
            outputs = _in_length_order(prompts, len, lambda chunk, config=config: self._generate(chunk, config))
            for i, tokens in zip(indices, outputs):
                texts[i] = cut_at_stop(self.vocabulary.decode(tokens), settings[i][1])
        for request, text in zip(requests, texts):
            self.cache_hook.add_partial("generate_until", request.args, text)
        return texts

    def _generate(self, prompts: list[list[int]], config: predict.DecodingConfig) -> list[list[int]]:
        first_batch = self._batches_sampled
        self._batches_sampled += -(-len(prompts) // self.args.batch_size)
        return predict.predict(model=self.config, params=self.params, prompts=prompts, decoding_config=config,
                               eos_id=-1 if self.eos_id is None else self.eos_id, batch_size=self.args.batch_size,
                               first_batch=first_batch, placement=self.placement, bos_id=self.bos_id,
                               zero_is_token=self.zero_is_token)
