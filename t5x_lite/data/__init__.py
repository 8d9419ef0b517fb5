"""Data: from text files to host-local batches, through prepared directories or seqio tasks.

A prepared directory (`prepare`) read by an `lm_task` (or a mixture of them) needs neither
TensorFlow nor seqio nor t5: task_registry.py knows the task, indexed/ reads it, records/ parses
its TFRecords and vocab/ tokenizes. seqio is imported only for a seqio task (tasks/, streaming/,
`cache`), and task_access.import_seqio names the extra to install when it is missing.

Owns, by job (each subpackage's docstring names its modules):
  task_factories.py    the gin task factories (`lm_task`, `span_corruption_task`, `prefix_lm_task`,
                       `text_task`, `text_to_text_task`, `mixture`): `lm_task` (and a mixture of
                       such) registers in task_registry.py, the others a seqio task of tasks/
  tasks/               the project's seqio tasks and mixtures, one module per family (each imports
                       TensorFlow, seqio and t5: only task_factories imports them, when called)
  iterators.py         the front door: `build` (a train iterator, by index when the task allows
                       and else streamed, or a validation pass), `check_split`, `pipeline_errors`
  indexed/             reading by index: the plan (index or stream, and why), `IndexedBatchIterator`,
                       the epoch rules (pure, shared with `t5x-lite estimate`), rows, permutation, mixing
  streaming/           reading by streaming through seqio: `BatchIterator`, the feature converters
  preparation/         the offline commands: `prepare` (corpus, SentencePiece vocabulary, shards),
                       `index`, and seqio task caching (`cache`)
  task_access.py       `DataConfig` (task, split, lengths, feature converter); of any task: `get_task`
                       (its seqio object), `task_vocabulary`, `task_features`, `split_documents`;
                       `import_seqio`
  task_registry.py     prepared LM tasks and their mixtures, known without seqio (registered in
                       seqio on first use through seqio)
  task_modules.py      importing a user's module of task registrations (MIXTURE_OR_TASK_MODULE)
  vocab/               a Hugging Face tokenizer's files and the seqio vocabularies made of them
  records/             a prepared directory's layout and metadata.json, its offset index, TFRecord
                       frames and shards streamed (CRC-checked)

Layers, top to bottom (pyproject.toml's exhaustive layers contract): task_factories; tasks;
iterators; indexed | preparation | streaming (independent of each other); task_access |
task_modules; task_registry; vocab; records.

Public names: `iterators.build`, `check_split`, `pipeline_errors`, `DataIterator`;
`task_access.DataConfig`, `get_task`, `task_vocabulary`, `targets_vocabulary`, `split_documents`,
`import_seqio`; `task_registry.lookup`; the `task_factories` functions;
`task_modules.import_task_module`; `streaming.input_pipeline.BatchIterator`, `epoch_rows`;
`indexed.index_plan.plan`, `register_lm_task`, `register_mixture`; `indexed.epochs.index_sources`,
`indexed_epoch`; `indexed.indexed_input.IndexedBatchIterator`; `preparation.prepare.prepare`;
`preparation.cache.cache_tasks`; `records.prepared_dataset.read_metadata`;
`vocab.hf_vocabulary.load_path`, `prepared_vocabulary`, `model_dir_vocabulary`, `write_model_dir_files`;
`vocab.sentencepiece_vocabulary.SentencePieceVocabulary`; `vocab.seqio_vocabularies.as_seqio`;
`vocab.tokenizer_files.decoder_start_id`, `zero_is_token`, `model_dir_tokenizer`;
`streaming.feature_converters.feature_converter`. tasks/ uses `records.prepared_dataset`,
`records.tfrecord_stream`, `vocab.hf_vocabulary`, `vocab.seqio_vocabularies` and `indexed.index_plan`; only `task_factories`
imports tasks/ (a contract in pyproject.toml).

May import (pyproject.toml's layers contract): parallel, metrics, models, storage, errors,
tf_setup, host_memory.
"""
