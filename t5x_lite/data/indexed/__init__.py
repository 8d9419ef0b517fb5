"""Reading by index: a run's rows read by number from prepared (or cached) splits, O(1) resume.

Owns:
  index_plan.py        whether a run's data is read by index or streamed (and why); the registry
                       of indexable tasks that data/tasks/ fills
  indexed_input.py     `IndexedBatchIterator`, a global shuffle per epoch, O(1) resume
  epochs.py            whether data is read by index, and the epoch's rows and steps then (pure;
                       `t5x-lite estimate` applies the same rules)
  token_rows.py        packed LM rows cut from a split's token stream (pure)
  index_permutation.py a seeded permutation evaluated at any position (Feistel; pure)
  mixing.py            a mixture's deterministic schedule of tasks by position (pure)

May import: data/task_access.py, data/vocab/, data/records/, storage, errors, tf_setup; not
data/streaming/ or data/preparation/ (pyproject.toml's layers contract).
"""
