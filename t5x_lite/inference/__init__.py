"""Inference: generating from and scoring with a model's params.

Owns:
  decoding.py    the one front door of generation: a family's `decode_call` (one batch's host
                 arrays and its jitted program, models/*_generation.py) placed on the mesh and run
  predict.py     `DecodingConfig`; `predict` (prompts -> token ids) and `score` (log-likelihood
                 of targets) for any family: what eval and infer call
  scoring.py     a decoder-only LM's log-probability of continuations, in length-bucketed batches
  prompts.py     how a prompt's text becomes the ids a model reads (an encoder-decoder's end with
                 EOS, as its task's inputs do): the one rule of infer's prompts file and `sample`
  infer_loop.py  the `infer` configurable: prompts -> chunked, resumable, sharded jsonl output
  sample.py      `t5x-lite sample`, and `sample_texts` (the samples printed during training)

Public names: `decoding.run`, `decode_batch`, `generate_rows`, `generate_batch`, `generate_seq2seq`,
`beam_search`, `new_token_limit`; `predict.DecodingConfig`,
`predict.predict`, `predict.score`; `scoring.score_rows`, `scoring.continuation_logprobs`;
`infer_loop.infer`; `prompts.encode_prompt`, `prompts.inputs_end_with_eos`; `sample.sample_texts`,
`sample.sample_tokens`.

May import (pyproject.toml's layers contract): checkpoints, data, parallel, metrics, models,
storage, errors, tf_setup.
"""
