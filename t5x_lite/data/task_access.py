"""Which task and split a run reads, with which feature converter and lengths; the task's vocabulary.

A task is a prepared task or mixture of data/task_registry.py (read without seqio) or a seqio
task; `get_task` gives the seqio object of either (importing seqio then, or naming the extra to
install), `targets_vocabulary` the vocabulary without seqio where it can. The batches come from
data/iterators.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from t5x_lite import storage
from t5x_lite.data import task_registry
from t5x_lite.errors import ConfigValueError, MissingExtraError, TaskDataError
from t5x_lite.tf_setup import import_tensorflow

DEFAULT_SEQUENCE_LENGTH = 256


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Which task to read and how to batch it (bound in gin/runs/*.gin).

    Attributes:
      mixture_or_task_name: a registered seqio task or mixture.
      split: dataset split, for example 'train' or 'validation'.
      sequence_length: length of each packed row the decoder reads. For 'prefix_lm' that row
        holds prefixes (inputs) and targets together. None: from task_feature_lengths, else
        DEFAULT_SEQUENCE_LENGTH.
      inputs_length: 'enc_dec': length of each packed row of inputs (the encoder's).
        'prefix_lm': how many of the sequence_length positions the inputs may take (None:
        half); the targets get the rest, so seqio's lengths are {'inputs': inputs_length,
        'targets': sequence_length - inputs_length} and the decoder row is their sum.
        'lm': unused.
      feature_converter: 'lm' (seqio.LMFeatureConverter) or 'prefix_lm'
        (seqio.PrefixLMFeatureConverter: inputs and targets concatenated, loss on the targets,
        the prefix attended bidirectionally) for decoder-only models; 'enc_dec'
        (seqio.EncDecFeatureConverter) for encoder-decoders. None picks the family's default
        ('lm' or 'enc_dec').
      batch_size: global batch size (rows per step over all processes).
      shuffle: shuffle files and examples (with a per-epoch seed).
      pack: pack several examples into each row (segment ids keep them apart).
      seed: data seed; data shard i (one per process) reads epoch e with input_pipeline.epoch_seed(seed, e, i),
        a hash of the three (for the shuffle and seqio's random preprocessors).
      use_cached: read seqio's offline cache of the task.
      reader: how training reads the split: 'index' (rows addressed by number through the split's
        offset index: a global shuffle per epoch, epoch lengths known up front, constant-time
        resume; an LM task over a prepared directory, or a mixture of them), 'stream' (seqio's
        tf.data pipeline), or 'auto' (index when the task can be read that way, else stream;
        the run's start-up line says which and why). See docs/data.md.
      task_feature_lengths: t5x's form of the two lengths, {'inputs': N, 'targets': M}: 'targets'
        is sequence_length ('prefix_lm': inputs + targets), 'inputs' is inputs_length. When set,
        sequence_length and inputs_length must be None or agree with it.
    """

    mixture_or_task_name: str
    split: str = "train"
    sequence_length: int | None = None
    inputs_length: int | None = None
    feature_converter: str | None = None
    batch_size: int = 8
    shuffle: bool = True
    pack: bool = True
    seed: int = 0
    use_cached: bool = False
    task_feature_lengths: Mapping[str, int] | None = None
    reader: str = "auto"

    def __post_init__(self):
        sequence_length, inputs_length = self._lengths()
        object.__setattr__(self, "sequence_length", sequence_length)
        object.__setattr__(self, "inputs_length", inputs_length)
        if self.feature_converter is not None and self.feature_converter not in FEATURE_CONVERTERS:
            raise ConfigValueError(f"Unknown feature_converter {self.feature_converter!r}; choose one of "
                             f"{list(FEATURE_CONVERTERS)}.")
        if self.reader not in READERS:
            raise ConfigValueError(f"Unknown DataConfig.reader {self.reader!r}; choose one of {list(READERS)}.")
        if self.feature_converter == "enc_dec" and not self.inputs_length:
            raise ConfigValueError("feature_converter='enc_dec' needs DataConfig.inputs_length (the encoder's "
                             "length); set --gin.INPUTS_LENGTH=... .")
        if self.feature_converter == "prefix_lm" and not 0 < self.prefix_length < self.sequence_length:
            raise ConfigValueError(
                f"feature_converter='prefix_lm' gives {self.prefix_length} of each row's "
                f"sequence_length={self.sequence_length} positions to the inputs and the rest to the targets; "
                f"both need some: set --gin.INPUTS_LENGTH between 1 and {self.sequence_length - 1} "
                "(or None for half).")

    def _lengths(self) -> tuple[int, int | None]:
        """(sequence_length, inputs_length), from task_feature_lengths when it is set."""
        lengths = self.task_feature_lengths
        if lengths is None:
            return (DEFAULT_SEQUENCE_LENGTH if self.sequence_length is None else self.sequence_length,
                    self.inputs_length)
        example = "e.g. --gin.TASK_FEATURE_LENGTHS=\"{'inputs': 512, 'targets': 128}\""
        if (not isinstance(lengths, Mapping) or "targets" not in lengths or set(lengths) - {"inputs", "targets"}
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in lengths.values())):
            raise ConfigValueError(f"TASK_FEATURE_LENGTHS={lengths!r} must map 'targets' (and, for encoder-decoders "
                                   f"and prefix LMs, 'inputs') to positive lengths; {example}.")
        inputs = lengths.get("inputs")
        if self.feature_converter == "prefix_lm":
            if inputs is None:
                raise ConfigValueError(f"TASK_FEATURE_LENGTHS={dict(lengths)!r} needs 'inputs' for the 'prefix_lm' "
                                       "feature converter (the prefix's length); " + example + ".")
            derived = (inputs + lengths["targets"], inputs)
        else:
            derived = (lengths["targets"], inputs)
        for name, macro, given, wanted in (("sequence_length", "SEQUENCE_LENGTH", self.sequence_length, derived[0]),
                                           ("inputs_length", "INPUTS_LENGTH", self.inputs_length, derived[1])):
            if given is not None and given != wanted:
                raise ConfigValueError(
                    f"TASK_FEATURE_LENGTHS={dict(lengths)!r} makes {macro} (DataConfig.{name}) {wanted}, but it is "
                    f"set to {given}: set the lengths one way only (drop {macro}, or make the two agree).")
        return derived

    def for_model(self, model: Any) -> "DataConfig":
        """This config with the feature converter the model reads filled in (the first of its
        `feature_converters`), or checked against them."""
        allowed, family = list(model.feature_converters), model.family
        if self.feature_converter not in (None, *allowed):
            raise ConfigValueError(f"The {family} model cannot read {self.split} batches from the "
                             f"{self.feature_converter!r} feature converter; set DataConfig.feature_converter "
                             f"to {' or '.join(map(repr, allowed))} (or None for {allowed[0]!r}).")
        converter = self.feature_converter or allowed[0]
        if converter == "lm" and "inputs" in (self.task_feature_lengths or {}):
            raise ConfigValueError(
                f"TASK_FEATURE_LENGTHS={dict(self.task_feature_lengths)!r} has 'inputs', which a decoder-only LM does "
                "not read: drop it, or set DataConfig.feature_converter = 'prefix_lm' to train a prefix LM.")
        return dataclasses.replace(self, feature_converter=converter)

    @property
    def converter(self) -> str:
        return self.feature_converter or "lm"

    @property
    def prefix_length(self) -> int:
        """'prefix_lm': the positions of a decoder row the inputs may take."""
        return self.sequence_length // 2 if self.inputs_length is None else self.inputs_length

    def seqio_lengths(self) -> dict[str, int]:
        """The lengths seqio's task and feature converter are given, by task feature."""
        if self.converter == "prefix_lm":
            return {"inputs": self.prefix_length, "targets": self.sequence_length - self.prefix_length}
        lengths = {"targets": self.sequence_length}
        if self.converter == "enc_dec":
            lengths["inputs"] = self.inputs_length
        return lengths

    def model_feature_shapes(self, rows: int) -> dict[str, tuple[int, int]]:
        """Shapes of the model's token inputs in a batch of `rows` rows."""
        shapes = {"decoder_input_tokens": (rows, self.sequence_length)}
        if self.converter == "enc_dec":
            shapes["encoder_input_tokens"] = (rows, self.inputs_length)
        if self.converter == "prefix_lm":
            shapes["decoder_causal_attention"] = (rows, self.sequence_length)
        return shapes


READERS = ("auto", "index", "stream")

# Name -> (seqio feature converter class name, whether its rows are one decoder stream that starts
# with the vocabulary's decoder start token (else 0, an encoder-decoder's decoder start)). A model
# config names the converters it reads (`feature_converters`).
FEATURE_CONVERTERS = {
    "lm": ("LMFeatureConverter", True),
    "prefix_lm": ("PrefixLMFeatureConverter", True),
    "enc_dec": ("EncDecFeatureConverter", False),
}


SEQIO_EXTRA = "pip install 't5x-lite[seqio]' (or `make install`, which installs every pinned package)"


def import_seqio(what: str) -> Any:
    """The seqio module, TensorFlow loaded first (quiet, off the GPUs); MissingExtraError naming the
    extra to install when they are not installed. `what` is what needs them."""
    try:
        import_tensorflow()
        import seqio  # seqio and TensorFlow load in seconds: imported where first needed
    except ImportError as e:
        raise MissingExtraError(f"{what} needs seqio, t5 and TensorFlow, which are not installed ({e}): "
                                f"{SEQIO_EXTRA}. Prepared data (`t5x-lite prepare`) read by lm_task needs none "
                                "of them.") from None
    return seqio


def get_task(name: str) -> Any:
    """The seqio task or mixture `name` (a prepared one is registered in seqio now), with the list of
    known names on a miss."""
    entry = task_registry.lookup(name)
    seqio = import_seqio(f"The seqio task {name!r}" if entry is None else f"Reading {name!r} through seqio")
    if entry is not None:
        return task_registry.seqio_task(entry)
    try:
        return seqio.get_mixture_or_task(name)
    except ValueError:
        known = sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names())
                       | task_registry.registered_names())
        raise TaskDataError(
            f"No seqio task or mixture named {name!r}. Known: {known}. Register it in a module "
            "and name that module with --gin.MIXTURE_OR_TASK_MODULE=\"'my.module'\"."
        ) from None


def add_cache_dirs(dirs: Sequence[str]) -> None:
    """Adds `dirs` to the directories seqio searches for any task's offline cache (t5x's
    --seqio_additional_cache_dirs; `t5x-lite cache --output_cache_dir` writes there)."""
    seqio = import_seqio("--seqio_additional_cache_dirs")
    seqio.add_global_cache_dirs([storage.absolute(d) for d in dirs])


def check_cached(provider: Any) -> None:
    """TaskDataError, one line naming the command that builds the cache and how a run finds it, when
    a task of `provider` (a seqio task or mixture read with use_cached) could be cached but is not.
    A task that cannot be cached at all (no seqio.CacheDatasetPlaceholder) seqio reads on the fly."""
    for task in getattr(provider, "tasks", None) or [provider]:
        if getattr(task, "supports_caching", False) and not task.cache_dir:
            import seqio  # imported with the task's own module already

            searched = seqio.get_global_cache_dirs()
            raise TaskDataError(
                f"Task {task.name!r} has no offline cache (USE_CACHED_TASKS=True; "
                f"{f'searched {searched}' if searched else 'no cache directory is named'}). Build it with "
                f"`t5x-lite cache --tasks={task.name} --output_cache_dir=DIR` and --module=MODULE or the run's "
                "--gin_file/--gin.X flags; then name DIR with --seqio_additional_cache_dirs=DIR, "
                "seqio.add_global_cache_dirs(['DIR']) in the task's module, or --gin.lm_task.cache_dir=\"'DIR'\" "
                "(docs/from_t5x.md); or read it on the fly: --gin.USE_CACHED_TASKS=False.")


def task_vocabulary(name: str) -> Any:
    """The `targets` vocabulary of task or mixture `name` (what the model reads and writes): a
    prepared one's without seqio, a seqio task's from seqio. A name that is neither fails as get_task."""
    entry = task_registry.lookup(name)
    if entry is not None:
        return task_registry.entry_vocabulary(entry)
    return get_task(name).output_features["targets"].vocabulary


def task_features(name: str) -> tuple[str, ...]:
    """The output features of task `name` ('targets'; 'inputs' too for text-to-text tasks)."""
    if task_registry.lookup(name) is not None:
        return ("targets",)
    return tuple(get_task(name).output_features)


def split_documents(name: str, split: str, *, max_tokens: int, limit: int | None = None) -> list[list[int]]:
    """The `targets` ids of task `name`'s split, one list per document (pieces of at most `max_tokens`
    ids, EOS included, as the task's preprocessors cut them), in order; the first `limit` (None: all).
    A prepared LM task is read without seqio."""
    entry = task_registry.lookup(name)
    if isinstance(entry, task_registry.PreparedTask):
        return task_registry.split_documents(entry, split, max_tokens=max_tokens, limit=limit)
    task = get_task(name)
    dataset = task.get_dataset(sequence_length={feature: max_tokens for feature in task.output_features},
                               split=split, shuffle=False, num_epochs=1)
    if limit is not None:
        dataset = dataset.take(limit)
    return [example["targets"].tolist() for example in dataset.as_numpy_iterator()]


def targets_vocabulary(config: DataConfig) -> Any:
    """The vocabulary of the task's `targets` (what the model reads and writes)."""
    return task_vocabulary(config.mixture_or_task_name)


def vocabulary_size(config: DataConfig) -> int:
    """Size of the task's `targets` vocabulary."""
    return targets_vocabulary(config).vocab_size
