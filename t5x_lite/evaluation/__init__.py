"""Evaluation: scoring checkpoints (perplexity, multiple choice, seqio metrics, lm-evaluation-harness).

Owns:
  eval_loop.py        the `evaluate` configurable: which checkpoints (one, latest, every, watch),
                      `PerplexityEval`, `MultipleChoiceEval`, `SeqioEval`; OUTPUT_DIR/step_<N>.json
  perplexity.py       strided perplexity over whole documents, as Hugging Face computes it
  multiple_choice.py  HellaSwag reading and multiple-choice accuracy, as lm-evaluation-harness scores it
  seqio_metrics.py    `seqio.Evaluator` over a task's metric_fns with inference/predict.py's functions
  lm_eval_model.py    lm-evaluation-harness's model `t5x_lite` (registered on import): loglikelihood,
                      loglikelihood_rolling and generate_until on the functions above and inference/
  lm_eval_command.py  `t5x-lite lm-eval`: lm-eval's own command line with `--model t5x_lite`

Public names: `eval_loop.evaluate`, `eval_loop.PerplexityEval`, `eval_loop.MultipleChoiceEval`,
`eval_loop.SeqioEval`, `eval_loop.score_multiple_choice_set` (also run during training);
`perplexity.perplexity`, `perplexity.document_rows`, `multiple_choice.score_multiple_choice` (bench/);
`lm_eval_model.T5xLiteLM` (imports lm_eval), `lm_eval_command.main`.

May import (pyproject.toml's layers contract): inference, checkpoints, data, parallel, metrics,
models, storage, errors, tf_setup.
"""
