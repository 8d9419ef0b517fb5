"""The task factories a gin file calls (`MIXTURE_OR_TASK_NAME = @lm_task()`).

Each registers a task and returns its name, so the data directory is always visible in the
config rather than hidden in code. `lm_task`, and `mixture` over such tasks, register in
data/task_registry.py, without seqio: their seqio tasks (data/tasks/) are registered only if
something reads them through seqio. The other factories register seqio tasks of data/tasks/,
whose modules import TensorFlow, seqio and t5: each imports its module only when it is called,
and names the extra to install when those packages are missing.
"""

from __future__ import annotations

from t5x_lite import storage
from t5x_lite.data import task_registry
from t5x_lite.data.task_access import import_seqio


def lm_task(*, name: str, data_dir: str, cache_dir: str | None = None) -> str:
    """Registers the LM task `name` over a prepared data directory and returns the name.

    Args:
      name: the seqio task name to register.
      data_dir: a directory written by `t5x-lite prepare` (local, gs:// or s3://).
      cache_dir: where `t5x-lite cache` wrote offline caches (its --output_cache_dir), read
        when DataConfig.use_cached is True.
    """
    data_dir = storage.absolute(data_dir)
    task_registry.read_metadata(data_dir)  # a missing or empty directory stops the run here

    def in_seqio():
        import_seqio(f"Reading the lm_task {name!r} through seqio")
        from t5x_lite.data.tasks import lm  # imports TensorFlow and seqio: only when called

        return lm.lm_task(name=name, data_dir=data_dir, cache_dir=cache_dir)

    task_registry.register(task_registry.PreparedTask(name=name, data_dir=data_dir, cache_dir=cache_dir,
                                                      in_seqio=in_seqio))
    return name


def span_corruption_task(*, name: str, data_dir: str, noise_density: float = 0.15,
                         mean_noise_span_length: float = 3.0) -> str:
    """Registers T5's span-corruption task `name` over a prepared directory and returns the name.

    Args:
      name: the seqio task name to register.
      data_dir: a directory written by `t5x-lite prepare`.
      noise_density: fraction of tokens replaced by sentinels.
      mean_noise_span_length: mean length of each corrupted span.
    """
    import_seqio("span_corruption_task")
    from t5x_lite.data.tasks import span_corruption  # imports TensorFlow and seqio: only when called

    return span_corruption.span_corruption_task(name=name, data_dir=data_dir, noise_density=noise_density,
                                                mean_noise_span_length=mean_noise_span_length)


def prefix_lm_task(*, name: str, data_dir: str) -> str:
    """Registers the prefix-LM task `name` (inputs: a random prefix, targets: the rest) and returns the name.

    Args:
      name: the seqio task name to register.
      data_dir: a directory written by `t5x-lite prepare`.
    """
    import_seqio("prefix_lm_task")
    from t5x_lite.data.tasks import prefix_lm  # imports TensorFlow and seqio: only when called

    return prefix_lm.prefix_lm_task(name=name, data_dir=data_dir)


def text_task(*, name: str, splits: dict[str, str], vocabulary: str, file_format: str | None = None,
              text_field: str = "text", on_bad_line: str = "fail") -> str:
    """Registers an LM task `name` over raw jsonl or TFRecord text files and returns the name.

    Args:
      name: the seqio task name to register.
      splits: file pattern per split, for example {'train': 'data/*.train.jsonl'}.
      vocabulary: a SentencePiece model file; a Hugging Face tokenizer.json, or a folder or converted
        model directory holding one (the model's own special ids, docs/interop.md "Tokenizers"); or
        'byte' for seqio's byte vocabulary.
      file_format: 'jsonl' or 'tfrecord'; None tells it from the file names.
      text_field: the jsonl field, or the tf.train.Example bytes feature, holding the text.
      on_bad_line: 'fail' (stop, naming the file and line) or 'skip' (skip, count and warn).
    """
    import_seqio("text_task")
    from t5x_lite.data.tasks import text  # imports TensorFlow and seqio: only when called

    return text.text_task(name=name, splits=splits, vocabulary=vocabulary, file_format=file_format,
                          text_field=text_field, on_bad_line=on_bad_line)


def text_to_text_task(*, name: str, splits: dict[str, str], vocabulary: str, metrics: tuple[str, ...] = ("accuracy",),
                      inputs_field: str = "inputs", targets_field: str = "targets") -> str:
    """Registers a task `name` of (inputs, targets) text pairs with metrics and returns the name.

    Args:
      name: the seqio task name to register.
      splits: jsonl file pattern per split, for example {'validation': 'data/qa.val.jsonl'}.
      vocabulary: a SentencePiece model file (such as a run's MODEL_DIR/vocab/spm.model), or 'byte'.
      metrics: seqio metric functions by name: accuracy, sequence_accuracy, bleu, rouge
        (prediction metrics) and log_likelihood (a score metric); see data/tasks/text_to_text.py.
      inputs_field: the jsonl field holding the inputs text.
      targets_field: the jsonl field holding the targets text.
    """
    import_seqio("text_to_text_task")
    from t5x_lite.data.tasks import text_to_text  # imports TensorFlow and seqio: only when called

    return text_to_text.text_to_text_task(name=name, splits=splits, vocabulary=vocabulary, metrics=metrics,
                                          inputs_field=inputs_field, targets_field=targets_field)


def mixture(*, name: str, tasks: list[tuple[str, float]], exhaust_all_tasks: bool = False) -> str:
    """Registers a seqio mixture `name` of registered tasks sampled by rate and returns the name.

    Args:
      name: the seqio mixture name to register.
      tasks: (task or mixture name, rate) pairs; rates are relative. A name may be a task
        factory's result, for example [(@a/lm_task(), 1.0), (@b/text_task(), 3.0)].
      exhaust_all_tasks: one epoch ends when every task is used up (True) or at the first draw
        of a used-up task (False, seqio's default); see data/tasks/mixtures.py.
    """
    prepared = task_registry.registered_names()
    if tasks and all(isinstance(pair, (tuple, list)) and pair and pair[0] in prepared for pair in tasks):
        task_registry.check_mixture(name, tasks, known=prepared, task_names=task_registry.prepared_task_names())
        pairs = tuple((task, float(rate)) for task, rate in tasks)

        def in_seqio():
            import_seqio(f"Reading the mixture {name!r} through seqio")
            from t5x_lite.data.tasks import mixtures  # imports TensorFlow and seqio: only when called

            return mixtures.register_mixture(name, list(pairs), exhaust_all_tasks=exhaust_all_tasks)

        task_registry.register(task_registry.PreparedMixture(name=name, tasks=pairs,
                                                             exhaust_all_tasks=exhaust_all_tasks, in_seqio=in_seqio))
        return name
    import_seqio(f"The mixture {name!r} of seqio tasks")
    from t5x_lite.data.tasks import mixtures  # imports TensorFlow and seqio: only when called

    return mixtures.mixture(name=name, tasks=tasks, exhaust_all_tasks=exhaust_all_tasks)
