"""SeqIO glue: which task and split a run reads, with which feature converter and lengths.

The batches themselves come from `t5x_lite.data.input_pipeline`.
"""

from __future__ import annotations

import dataclasses

from t5x_lite.errors import ConfigValueError, TaskDataError
from t5x_lite.tf_setup import import_tensorflow


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Which task to read and how to batch it (bound in gin/runs/*.gin).

    Attributes:
      mixture_or_task_name: a registered seqio task or mixture.
      split: dataset split, for example 'train' or 'validation'.
      sequence_length: length of each packed row the decoder reads. For 'prefix_lm' that row
        holds prefixes (inputs) and targets together.
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
    """

    mixture_or_task_name: str
    split: str = "train"
    sequence_length: int = 256
    inputs_length: int | None = None
    feature_converter: str | None = None
    batch_size: int = 8
    shuffle: bool = True
    pack: bool = True
    seed: int = 0
    use_cached: bool = False

    def __post_init__(self):
        if self.feature_converter is not None and self.feature_converter not in FEATURE_CONVERTERS:
            raise ConfigValueError(f"Unknown feature_converter {self.feature_converter!r}; choose one of "
                             f"{list(FEATURE_CONVERTERS)}.")
        if self.feature_converter == "enc_dec" and not self.inputs_length:
            raise ConfigValueError("feature_converter='enc_dec' needs DataConfig.inputs_length (the encoder's "
                             "length); set --gin.INPUTS_LENGTH=... .")
        if self.feature_converter == "prefix_lm" and not 0 < self.prefix_length < self.sequence_length:
            raise ConfigValueError(
                f"feature_converter='prefix_lm' gives {self.prefix_length} of each row's "
                f"sequence_length={self.sequence_length} positions to the inputs and the rest to the targets; "
                f"both need some: set --gin.INPUTS_LENGTH between 1 and {self.sequence_length - 1} "
                "(or None for half).")

    def for_model_family(self, family: str) -> "DataConfig":
        """This config with the feature converter `family` needs filled in (the family's first), or checked."""
        allowed = [name for name, (_, feeds) in FEATURE_CONVERTERS.items() if feeds == family]
        if self.feature_converter not in (None, *allowed):
            raise ConfigValueError(f"The {family} model cannot read {self.split} batches from the "
                             f"{self.feature_converter!r} feature converter; set DataConfig.feature_converter "
                             f"to {' or '.join(map(repr, allowed))} (or None for {allowed[0]!r}).")
        return dataclasses.replace(self, feature_converter=self.feature_converter or allowed[0])

    @property
    def converter(self) -> str:
        return self.feature_converter or "lm"

    @property
    def prefix_length(self) -> int:
        """'prefix_lm': the positions of a decoder row the inputs may take."""
        return self.sequence_length // 2 if self.inputs_length is None else self.inputs_length

    def task_feature_lengths(self) -> dict[str, int]:
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


# Name -> (seqio feature converter class name, the model family it feeds); a family's first
# converter is its default.
FEATURE_CONVERTERS = {
    "lm": ("LMFeatureConverter", "decoder_only"),
    "prefix_lm": ("PrefixLMFeatureConverter", "decoder_only"),
    "enc_dec": ("EncDecFeatureConverter", "encoder_decoder"),
}


def get_task(name: str):
    """The registered seqio task or mixture `name`, with the list of known names on a miss."""
    import_tensorflow()  # first, so that seqio finds it quiet and off the GPUs
    import seqio  # seqio and TensorFlow load in seconds: imported where first needed

    try:
        return seqio.get_mixture_or_task(name)
    except ValueError:
        known = sorted(seqio.TaskRegistry.names()) + sorted(seqio.MixtureRegistry.names())
        raise TaskDataError(
            f"No seqio task or mixture named {name!r}. Known: {known}. Register it in a module "
            "and name that module with --gin.MIXTURE_OR_TASK_MODULE=\"'my.module'\"."
        ) from None


def vocabulary_size(config: DataConfig) -> int:
    """Size of the task's `targets` vocabulary."""
    return get_task(config.mixture_or_task_name).output_features["targets"].vocabulary.vocab_size
