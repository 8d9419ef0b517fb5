"""Preparation: the offline commands that write what runs read (`prepare`, `index`, `cache`).

Owns:
  prepare.py           `t5x-lite prepare`: its flags, checks and steps in order (local or gs://, s3://)
  corpus.py            prepare's inputs: files, directories and globs (binary files skipped), documents,
                       each one's split, the vocabulary's sample
  formats.py           the reader of each input format, by suffix (text, .jsonl, .jsonl.gz, .jsonl.zst,
                       .parquet), streaming; PrepareError
  spm_vocabulary.py    the SentencePiece vocabulary: trained, checked, written; tokenizing in workers
                       (with it or with a Hugging Face tokenizer)
  shards.py            a prepared directory's TFRecord shards, written; an earlier run's outputs cleared
  index_command.py     `t5x-lite index DATA_DIR`: the index of a directory prepared without one
  cache.py             seqio task caching as an Apache Beam pipeline, then each cached split's offset
                       index (the `cache` command is in config/)

May import: data/task_access.py, data/vocab/, data/records/, storage, errors, tf_setup, host_memory; not
data/indexed/ or data/streaming/ (pyproject.toml's layers contract).
"""
