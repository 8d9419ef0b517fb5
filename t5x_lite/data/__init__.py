"""Data: from text files to host-local batches, through seqio tasks.

Owns:
  prepare.py           `t5x-lite prepare`: its flags, checks and steps in order (local or gs://, s3://)
  corpus.py            prepare's inputs: files, documents, each one's split, the vocabulary's sample
  spm_vocabulary.py    the SentencePiece vocabulary: trained, checked, written; tokenizing in workers
                       (with it or with a Hugging Face tokenizer)
  prepared_dataset.py  a prepared directory's files: TFRecord shards, metadata.json, the tokenizer copy
  tasks/               the project's seqio tasks and mixtures, one module per family (each imports
                       TensorFlow, seqio and t5: only task_factories imports them, when called)
  task_factories.py    the gin task factories (`lm_task`, `span_corruption_task`, `prefix_lm_task`,
                       `text_task`, `text_to_text_task`, `mixture`): each registers a task of tasks/
  task_modules.py      importing a user's module of task registrations (MIXTURE_OR_TASK_MODULE)
  task_access.py       `DataConfig` (task, split, lengths, feature converter), `get_task`, `vocabulary_size`
  input_pipeline.py    streaming: epochs of a data shard through seqio; `BatchIterator`, checkpointable
                       with a few integers
  index_plan.py        whether a run's data is read by index or streamed (and why); the registry
                       of indexable tasks that tasks/ fills
  indexed_input.py     by index: `IndexedBatchIterator`, a global shuffle per epoch, O(1) resume
  epochs.py            whether data is read by index, and the epoch's rows and steps then (pure;
                       `t5x-lite estimate` applies the same rules)
  record_index.py      a prepared split's offset index: written, checked, records read by number
  index_command.py     `t5x-lite index DATA_DIR`: the index of a directory prepared without one
  token_rows.py        packed LM rows cut from a split's token stream (pure)
  index_permutation.py a seeded permutation evaluated at any position (Feistel; pure)
  mixing.py            a mixture's deterministic schedule of tasks by position (pure)
  tfrecord_stream.py   TFRecord shards streamed through storage (CRC-checked), for s3://
  record_frame.py      one TFRecord frame read and checked (length, CRCs): what is wrong, if anything
  tokenizer_files.py   a Hugging Face tokenizer's files: which file a path names, its special ids, the
                       decoder start (BOS, else EOS), whether id 0 is a real token; MODEL_DIR/hf/'s
  tokenizer_json.py    `TokenizerJsonVocabulary`: a tokenizer.json as a seqio vocabulary (Python and TF)
  hf_sentencepiece.py  `HfSentencePieceVocabulary`: a model's SentencePiece tokenizer.model, its own ids
  hf_vocabulary.py     those vocabularies from a path, a prepared directory or a model directory
  feature_converters.py seqio's converters with the vocabulary's decoder start and a real token 0 kept
  cache.py             seqio task caching as an Apache Beam pipeline, then each cached split's offset index
                       (the `cache` command is in config/)

Public names: `task_access.DataConfig`, `get_task`, `vocabulary_size`; the `task_factories`
functions; `task_modules.import_task_module`; `input_pipeline.BatchIterator`, `epoch_rows`;
`index_plan.plan`, `register_lm_task`, `register_mixture`; `epochs.index_sources`, `indexed_epoch`; `indexed_input.IndexedBatchIterator`;
`prepare.prepare`; `prepared_dataset.read_metadata`; `cache.cache_tasks`;
`hf_vocabulary.load_path`, `model_dir_vocabulary`, `write_model_dir_files`;
`tokenizer_files.decoder_start_id`, `zero_is_token`, `model_dir_tokenizer`;
`feature_converters.feature_converter`. tasks/ uses `prepared_dataset`, `tfrecord_stream`,
`hf_vocabulary` and `index_plan`; only `task_factories` imports tasks/ (a contract in pyproject.toml).

May import (pyproject.toml's layers contract): parallel, metrics, models, storage, errors,
tf_setup.
"""
