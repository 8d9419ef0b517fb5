"""Data: from text files to host-local batches, through seqio tasks.

Owns:
  prepare.py           `t5x-lite prepare`: its flags, checks and steps in order (local or gs://, s3://)
  corpus.py            prepare's inputs: files, documents, each one's split, the vocabulary's sample
  spm_vocabulary.py    the SentencePiece vocabulary: trained, checked, written; tokenizing in workers
  prepared_dataset.py  a prepared directory's files: TFRecord shards and metadata.json, written and read
  builtin_tasks.py     loads the project's task modules (tasks/) as the package `t5x_lite_tasks`
  task_factories.py    the gin task factories (`lm_task`, `span_corruption_task`, `prefix_lm_task`,
                       `text_task`, `text_to_text_task`, `mixture`): each registers a task of tasks/
  task_modules.py      importing a user's module of task registrations (MIXTURE_OR_TASK_MODULE)
  task_access.py       `DataConfig` (task, split, lengths, feature converter), `get_task`, `vocabulary_size`
  input_pipeline.py    epochs of a data shard; `BatchIterator`, checkpointable with a few integers
  tfrecord_stream.py   TFRecord shards streamed through storage (CRC-checked), for s3://
  tokenizer_json.py    a Hugging Face tokenizer.json as the vocabulary of a converted model
  cache.py             seqio task caching as an Apache Beam pipeline (the `cache` command is in config/)

Public names: `task_access.DataConfig`, `get_task`, `vocabulary_size`; the `task_factories`
functions; `task_modules.import_task_module`; `input_pipeline.BatchIterator`, `epoch_rows`;
`prepare.prepare`; `prepared_dataset.read_metadata`; `cache.cache_tasks`;
`tokenizer_json.TokenizerJsonVocabulary`. tasks/ uses `prepared_dataset` and `tfrecord_stream`.

May import (pyproject.toml's layers contract): parallel, metrics, models, storage, errors,
tf_setup; and the task modules of tasks/ (outside the package, through builtin_tasks.py).
"""
