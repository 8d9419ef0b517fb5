"""SeqIO glue: which task and split a run reads, with which feature converter and lengths.

The batches themselves come from `t5x_lite.input_pipeline`.
"""

from __future__ import annotations

import dataclasses
from t5x_lite.errors import ConfigValueError
from t5x_lite.tf_setup import import_tensorflow


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Which task to read and how to batch it (bound in gin/runs/*.gin).

    Attributes:
      mixture_or_task_name: a registered seqio task or mixture.
      split: dataset split, for example 'train' or 'validation'.
      sequence_length: length of each packed row of targets.
      inputs_length: length of each packed row of inputs (encoder-decoder only).
      feature_converter: 'lm' (seqio.LMFeatureConverter, for decoder-only models) or
        'enc_dec' (seqio.EncDecFeatureConverter, for encoder-decoders); None picks the one
        the model family needs.
      batch_size: global batch size (rows per step over all processes).
      shuffle: shuffle files and examples (with a per-epoch seed).
      pack: pack several examples into each row (segment ids keep them apart).
      seed: data seed; epoch e uses seed + e.
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

    def for_model_family(self, family: str) -> "DataConfig":
        """This config with the feature converter `family` needs filled in (or checked)."""
        wanted = next(name for name, (_, feeds) in FEATURE_CONVERTERS.items() if feeds == family)
        if self.feature_converter not in (None, wanted):
            raise ConfigValueError(f"The {family} model cannot read {self.split} batches from the "
                             f"{self.feature_converter!r} feature converter; set DataConfig.feature_converter "
                             f"to {wanted!r} (or None).")
        return dataclasses.replace(self, feature_converter=wanted)

    @property
    def converter(self) -> str:
        return self.feature_converter or "lm"

    def task_feature_lengths(self) -> dict[str, int]:
        lengths = {"targets": self.sequence_length}
        if self.converter == "enc_dec":
            lengths["inputs"] = self.inputs_length
        return lengths

    def model_feature_shapes(self, rows: int) -> dict[str, tuple[int, int]]:
        """Shapes of the model's token inputs in a batch of `rows` rows."""
        shapes = {"decoder_input_tokens": (rows, self.sequence_length)}
        if self.converter == "enc_dec":
            shapes["encoder_input_tokens"] = (rows, self.inputs_length)
        return shapes


# Name -> (seqio feature converter class name, the model family it feeds).
FEATURE_CONVERTERS = {
    "lm": ("LMFeatureConverter", "decoder_only"),
    "enc_dec": ("EncDecFeatureConverter", "encoder_decoder"),
}


def get_task(name: str):
    """The registered seqio task or mixture `name`, with the list of known names on a miss."""
    import seqio

    import_tensorflow()
    try:
        return seqio.get_mixture_or_task(name)
    except ValueError:
        known = sorted(seqio.TaskRegistry.names()) + sorted(seqio.MixtureRegistry.names())
        raise ValueError(
            f"No seqio task or mixture named {name!r}. Known: {known}. Register it in a module "
            "and name that module with --gin.MIXTURE_OR_TASK_MODULE=\"'my.module'\"."
        ) from None


def vocabulary_size(config: DataConfig) -> int:
    """Size of the task's `targets` vocabulary."""
    return get_task(config.mixture_or_task_name).output_features["targets"].vocabulary.vocab_size
