"""`BaseModel`: the one interface every model family implements, and what their configs share.

A family is a frozen config dataclass on `BaseModel` (decoder_only.py's `DecoderConfig`,
encoder_decoder.py's `T5Config`): its fields are the model's sizes and switches, and its methods
are everything the rest of the package asks of a model -- the module and the inputs to
initialise it with, the loss sums of a batch, the training FLOPs, the feature converters that
feed it, how long a prompt may be, how it generates (`decode_call`) and scores
(`score_call`), and which Hugging Face architectures represent it. Training, evaluation,
inference, the estimate and the converters call only these; none of them asks which family a
model is. Defining a subclass with a `family` name registers it (`FAMILIES`), so a checkpoint's
metadata names the class that reads it back.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, ClassVar, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from t5x_lite.errors import ConfigValueError
from t5x_lite.models import layers, losses, stack
from t5x_lite.models.generation import DecodeCall, PromptTooLongError

# The label features of a batch (seqio's names); every other feature is a model input.
LABEL_FEATURES = ("decoder_target_tokens", "decoder_loss_weights")

# family name -> config class, filled as each family's class is defined.
FAMILIES: dict[str, type["BaseModel"]] = {}

# Compute dtypes a model runs in; parameters and optimizer state are float32 whatever this says.
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")

# `scan_unroll='auto'`: the train loop chooses the layer layout once, at start-up
# (parallel/layer_layout.py), and trains with the number it chose.
AUTO_UNROLL = "auto"


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """A ConfigValueError naming the field, the bad value and the valid ones."""
    if value not in choices:
        raise ConfigValueError(f"Unknown {name} {value!r}; choose one of {list(choices)}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class BaseModel:
    """The model interface: a base for the frozen config dataclasses of each family.

    Every family has the fields `vocab_size`, `dtype`, `remat_policy`, `scan_layers`,
    `scan_unroll`, `mlp_activations` and `dropout_rate`; the class attributes and methods below
    are what the rest of the package calls.
    """

    family: ClassVar[str]  # the name written into checkpoint metadata ({'family': ..., 'model': {...}})
    # Whether the model continues one token stream (a causal LM): in-training samples, `sample`,
    # multiple-choice scoring and lm-eval need it; an encoder-decoder reads inputs and writes targets.
    continues_text: ClassVar[bool] = False
    # The feature converters that feed it (data/task_access.py FEATURE_CONVERTERS); the first is the default.
    feature_converters: ClassVar[tuple[str, ...]] = ()
    # DecodingConfig methods it generates with.
    decoding_methods: ClassVar[tuple[str, ...]] = ("greedy", "sample")
    # Hugging Face model_types (hf/families.py) that may represent it, in order of preference.
    hf_model_types: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "family" in cls.__dict__:
            FAMILIES[cls.family] = cls

    @staticmethod
    def from_metadata(family: str, values: dict[str, Any]) -> "BaseModel":
        """Rebuilds a model config from checkpoint metadata ({'family': ..., 'model': {...}})."""
        if family not in FAMILIES:
            raise ConfigValueError(f"Unknown model family {family!r}; known: {sorted(FAMILIES)}. A family of "
                                   "your own must be imported (a gin file's `import`) before its checkpoints are read.")
        return FAMILIES[family](**values)

    # ------------------------------------------------------------------ what each family defines

    def make_module(self) -> Any:
        """The Flax module; it takes the batch's model inputs by seqio feature name."""
        raise NotImplementedError

    def num_params(self) -> int:
        """Parameter count from the sizes alone."""
        raise NotImplementedError

    def num_embedding_params(self) -> int:
        """Parameters of lookup tables (left out of the FLOPs)."""
        raise NotImplementedError

    def train_flops_per_token(self, *, targets_length: int, inputs_length: int | None = None) -> float:
        """Training FLOPs per target token, as MFU counts them."""
        raise NotImplementedError

    def attention(self, platform: str | None = None) -> str:
        """The attention implementation the model runs on `platform` (layers.ATTENTION_IMPLEMENTATIONS)."""
        return "xla"

    def activation_stacks(self, *, rows: int, length: int, inputs_length: int | None) -> list[dict[str, float]]:
        """Per stack of layers, what the memory estimate's activation arithmetic needs (unsharded): num_layers,
        tokens, width (the residual stream), mlp (hidden width) and n_mlp_in (its input projections), q and kv
        widths per token, scores (attention score columns over all heads) and attention_blocks (default 1)."""
        raise NotImplementedError

    def check_lengths(self, *, sequence_length: int, split: str) -> None:
        """Refuses (RunConfigError) batch rows longer than the model can read; nothing to refuse by default."""

    # ------------------------------------------------------------------ shared behaviour

    def metadata(self) -> dict[str, Any]:
        """{'family', 'model'}: how a checkpoint names this model (through JSON, so it compares equal to
        what a checkpoint's metadata reads back: lists, not tuples)."""
        return {"family": self.family, "model": json.loads(json.dumps(self.to_dict()))}

    @staticmethod
    def field_defaults(family: Any) -> dict[str, Any]:
        """The defaults of the family's config fields (empty for an unknown family), as JSON values."""
        cls = FAMILIES.get(family)
        if cls is None:
            return {}
        defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        return json.loads(json.dumps(defaults))

    def init_inputs(self, rows: int = 1, length: int = 8, inputs_length: int | None = None) -> dict[str, Any]:
        """Input shapes the module is initialised with, by seqio feature name."""
        del inputs_length
        return {"decoder_input_tokens": jax.ShapeDtypeStruct((rows, length), np.int32)}

    @staticmethod
    def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
        """The features the module reads: everything but the labels."""
        return {k: v for k, v in batch.items() if k not in LABEL_FEATURES}

    def loss_sums(self, params: Any, batch: dict[str, Any], *, z_loss: float = 0.0, label_smoothing: float = 0.0,
                  deterministic: bool = True, rng: Any = None, module: Any = None) -> dict[str, jax.Array]:
        """Summed loss, z-loss and target weight of one (micro)batch: {'loss_sum', 'z_loss_sum', 'weight_sum'}."""
        module = self.make_module() if module is None else module
        rngs = None if deterministic else {"dropout": rng}
        logits = module.apply({"params": params}, **self.model_inputs(batch), deterministic=deterministic, rngs=rngs)
        return losses.weighted_loss_sums(logits, batch["decoder_target_tokens"], batch["decoder_loss_weights"],
                                         z_loss=z_loss, label_smoothing=label_smoothing)

    @staticmethod
    def loss_weight(batch: dict[str, Any]) -> jax.Array:
        """The batch's total target weight (the loss is normalised by it)."""
        return jnp.sum(batch["decoder_loss_weights"].astype(jnp.float32))

    def max_prompt_tokens(self, max_new_tokens: int = 1) -> int | None:
        """The longest prompt that leaves room for `max_new_tokens` new tokens (None: no limit)."""
        del max_new_tokens
        return None

    def check_prompts(self, prompts: Sequence[Sequence[int]], *, what: str = "prompt", first_index: int = 0,
                      max_new_tokens: int = 1) -> None:
        """The one prompt-length rule: a PromptTooLongError naming the first prompt that does not fit."""
        longest = self.max_prompt_tokens(max_new_tokens)
        if longest is None:
            return
        for i, prompt in enumerate(prompts):
            if len(prompt) > longest:
                room = f" and {max_new_tokens} new token{'s' if max_new_tokens > 1 else ''}" if max_new_tokens else ""
                raise PromptTooLongError(
                    f"{what} {first_index + i} has {len(prompt)} tokens, but {self.describe_context()} holds at "
                    f"most {longest} prompt tokens{room}; shorten or drop that prompt.")

    def describe_context(self) -> str:
        """How the model's context is limited, for the prompt-length message."""
        return "the model's context"

    def fit_prompt(self, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        """The prompt's last tokens that fit with `max_new_tokens` new ones (at least its last token)."""
        longest = self.max_prompt_tokens(max_new_tokens)
        return list(prompt) if longest is None else list(prompt[-max(1, longest):])

    def decode_call(self, rows: Sequence[Sequence[int] | None], *, method: str, max_new_tokens: int,
                    sampling: tuple, rng: Any, eos_id: int, bos_id: int, use_cache: bool = True,
                    beam_size: int = 4, alpha: float = 0.6) -> DecodeCall:
        """One batch of generation as host arrays and the jitted program that runs on them (None rows: padding)."""
        raise NotImplementedError(f"{type(self).__name__} does not generate.")

    def score_call(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, bos_id: int | None) -> DecodeCall:
        """One batch of (inputs, targets) scoring: host arrays and the program whose first output column
        is log p(targets | inputs) per row. A causal LM reads `bos_id` first (None: the inputs already
        start with what it reads first)."""
        raise NotImplementedError(f"{type(self).__name__} does not score.")

    def _check_common(self) -> None:
        self._check_field_types()
        check_choice(f"{type(self).__name__}.dtype", self.dtype, COMPUTE_DTYPES)
        # JSON (checkpoint metadata) turns tuples into lists; keep the config hashable.
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        stack.remat_policy(self.remat_policy)  # fails early on an unknown name
        if self.scan_unroll != AUTO_UNROLL and not (_is_int(self.scan_unroll) and self.scan_unroll >= 1):
            raise ConfigValueError(f"{type(self).__name__}.scan_unroll={self.scan_unroll!r} must be a positive "
                                   f"integer or {AUTO_UNROLL!r}.")
        if self.scan_unroll not in (1, AUTO_UNROLL) and not self.scan_layers:
            raise ConfigValueError(
                f"{type(self).__name__}.scan_unroll={self.scan_unroll} applies to scanned layers only; "
                "set scan_layers=True, or leave scan_unroll at 1 with unrolled layers.")
        for name in self.mlp_activations:
            check_choice("mlp_activations entry", name, tuple(layers.ACTIVATIONS))

    def _check_field_types(self) -> None:
        """Sizes are positive integers (or None where optional), rates and scales numbers in range,
        switches True/False."""
        name = type(self).__name__
        for field in dataclasses.fields(self):
            value, kind = getattr(self, field.name), field.type
            if kind == "int" and not (_is_int(value) and value >= 1):
                raise ConfigValueError(f"{name}.{field.name}={value!r} must be a positive integer.")
            if kind == "int | None" and not (value is None or (_is_int(value) and value >= 1)):
                raise ConfigValueError(f"{name}.{field.name}={value!r} must be a positive integer or None.")
            if kind == "bool" and not isinstance(value, bool):
                raise ConfigValueError(f"{name}.{field.name}={value!r} must be True or False.")
            if kind == "str" and not isinstance(value, str):
                raise ConfigValueError(f"{name}.{field.name}={value!r} must be a string in quotes.")
            if kind in ("float", "float | None") and not (
                    (value is None and kind != "float") or (_is_number(value) and value >= 0)):
                raise ConfigValueError(f"{name}.{field.name}={value!r} must be a number >= 0"
                                       + (" or None." if kind != "float" else "."))
        if not self.dropout_rate < 1:
            raise ConfigValueError(f"{name}.dropout_rate={self.dropout_rate!r} must be in [0, 1).")

    def check_batch(self, batch: Any) -> None:
        """Refuses a host batch (a mapping of numpy arrays) this model cannot run as configured;
        the train loop calls it before each step. Nothing to refuse unless a family says so."""

    @property
    def layers_per_iteration(self) -> int:
        """Scanned layers one iteration of the compiled loop runs: `scan_unroll`, or 1 (the loop) while
        it is 'auto'. The train loop replaces 'auto' with its choice before it builds the step; a model
        built elsewhere from a config that still says 'auto' (the estimate's compile, a config given to
        eval or infer) compiles the loop."""
        return 1 if self.scan_unroll == AUTO_UNROLL else self.scan_unroll

    @property
    def compute_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
