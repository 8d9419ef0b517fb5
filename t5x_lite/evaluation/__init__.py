"""Evaluation: scoring checkpoints (perplexity, multiple choice, seqio metrics).

Owns:
  eval_loop.py        the `evaluate` configurable: which checkpoints (one, latest, every, watch),
                      `PerplexityEval`, `MultipleChoiceEval`, `SeqioEval`; OUTPUT_DIR/step_<N>.json
  perplexity.py       strided perplexity over whole documents, as Hugging Face computes it
  multiple_choice.py  HellaSwag reading and multiple-choice accuracy, as lm-evaluation-harness scores it
  seqio_metrics.py    `seqio.Evaluator` over a task's metric_fns with inference/predict.py's functions

Public names: `eval_loop.evaluate`, `eval_loop.PerplexityEval`, `eval_loop.MultipleChoiceEval`,
`eval_loop.SeqioEval`, `eval_loop.score_multiple_choice_set` (also run during training);
`perplexity.perplexity`, `multiple_choice.score_multiple_choice` (bench/).

May import (pyproject.toml's layers contract): inference, checkpoints, data, parallel, metrics,
models, storage, errors, tf_setup.
"""
