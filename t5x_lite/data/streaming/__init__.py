"""Streaming: a split's epochs read through seqio's pipeline.

Owns:
  input_pipeline.py     epochs of a data shard through seqio; `BatchIterator`, checkpointable with a
                        few integers; `epoch_rows`
  feature_converters.py seqio's converters with the vocabulary's decoder start and a real token 0 kept

May import: data/task_access.py, data/vocab/, data/records/, storage, errors, tf_setup;
not data/indexed/ or data/preparation/ (pyproject.toml's layers contract).
"""
