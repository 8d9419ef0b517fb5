"""The project's seqio task and mixture registrations, one module per family.

Owns:
  lm.py               LM tasks over a prepared directory (`lm_task`); the prepared source and
                      vocabulary the other prepared-directory tasks share
  span_corruption.py  T5's span corruption over a prepared directory
  prefix_lm.py        prefix LM (a random prefix as inputs, the rest as targets) over a prepared directory
  text.py             LM tasks over raw jsonl or TFRecord text, tokenized when read
  text_to_text.py     (inputs, targets) pairs from jsonl, with seqio metrics
  mixtures.py         mixtures of registered tasks sampled by rate

Every module imports TensorFlow, seqio and t5 when it is imported, so only the gin task factories
(data/task_factories.py) import them, inside the factory that registers the task: importing
t5x_lite stays cheap. Tasks over prepared data are registered when a gin file calls their
factory, so the data directory is always visible in the config rather than hidden in code.

May import: data/ (prepared_dataset, tfrecord_stream, hf_vocabulary, seqio_vocabularies, index_plan), storage,
errors, tf_setup; never task_factories (pyproject.toml's contract on data/).
"""
