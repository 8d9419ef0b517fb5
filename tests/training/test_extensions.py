"""Extending t5x_lite from outside the package: a model family, an optimizer and a hook defined in a
user's own module (written here), imported by a gin file's `import`, each trained for two steps
through the real `t5x-lite train`."""

from __future__ import annotations

import json
import textwrap

import pytest

from t5x_lite.checkpoints import checkpoint
from tests import cli_helpers

USER_MODULE = textwrap.dedent('''
    """A user's extensions: a bigram LM family, sign-SGD, and a hook that logs the loss."""
    import dataclasses
    import json

    import gin
    import optax
    from flax import linen as nn

    from t5x_lite.models import BaseModel, layers
    from t5x_lite.training.hooks import Hook
    from t5x_lite.training.optim import Optimizer


    class Bigram(nn.Module):
        config: "BigramLM"

        @nn.compact
        def __call__(self, decoder_input_tokens, deterministic=True, **unused_features):
            x = layers.Embed(self.config.vocab_size, self.config.emb_dim, name="embed")(decoder_input_tokens)
            return layers.Dense((self.config.vocab_size,), axes=("embed", "vocab"), name="logits")(x)


    @gin.configurable
    @dataclasses.dataclass(frozen=True)
    class BigramLM(BaseModel):
        vocab_size: int = 512
        emb_dim: int = 32
        dtype: str = "float32"
        remat_policy: str = "none"
        scan_layers: bool = False
        scan_unroll: int = 1
        mlp_activations: tuple = ()
        dropout_rate: float = 0.0

        family = "bigram_lm"
        feature_converters = ("lm",)

        def make_module(self):
            return Bigram(self)

        def num_params(self):
            return 2 * self.vocab_size * self.emb_dim

        def num_embedding_params(self):
            return self.vocab_size * self.emb_dim

        def train_flops_per_token(self, *, targets_length, inputs_length=None):
            return 6.0 * self.vocab_size * self.emb_dim


    @gin.configurable
    @dataclasses.dataclass(frozen=True)
    class SignSGD(Optimizer):
        learning_rate: object = None
        clip_grad_norm: float | None = None

        def build(self, total_steps, logical_axes=None):
            return optax.chain(optax.scale_by_sign(), optax.scale_by_learning_rate(self.schedule(total_steps)))


    @gin.configurable
    class LossLog(Hook):
        def __init__(self, path, every=1):
            super().__init__(every=every)
            self.path = path

        def run(self, info):
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": info.step, "loss": info.latest.train.get("loss")}) + "\\n")
''')


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    with cli_helpers.importable_module(tmp_path_factory.mktemp("user_code"), "my_extensions", USER_MODULE) as folder:
        yield folder


def _train(data_dir, model_dir, folder, *bindings: str):
    gin_file = folder / f"{model_dir.name}.gin"
    gin_file.write_text("import my_extensions\n" + "".join(f"{b}\n" for b in bindings))
    return cli_helpers.train_in_process(data_dir, model_dir, f"--gin_file={gin_file}", "--gin.TRAIN_STEPS=2",
                                        "--gin.train.log_period=1", "--gin.train.eval_period=0")


def test_a_model_family_from_a_users_module_trains_and_its_checkpoint_names_it(small_data_dir, tmp_path, user_module):
    result = _train(small_data_dir, tmp_path / "bigram", user_module, "train.model = @BigramLM()")
    assert result.returncode == 0, result.stderr
    assert "model: bigram_lm" in result.stdout
    losses = cli_helpers.losses(result.stdout)
    assert len(losses) == 2 and all(0 < loss < 20 for loss in losses)
    checkpoints = checkpoint.Checkpointer(str(tmp_path / "bigram"), read_only=True)
    try:
        metadata = checkpoints.metadata(2)
    finally:
        checkpoints.close()
    assert metadata["family"] == "bigram_lm" and metadata["model"]["emb_dim"] == 32


def test_an_optimizer_from_a_users_module_trains(small_data_dir, tmp_path, user_module):
    result = _train(small_data_dir, tmp_path / "signsgd", user_module, "train.optimizer = @SignSGD()",
                    "SignSGD.learning_rate = @Constant()", "Constant.learning_rate = 1e-3")
    assert result.returncode == 0, result.stderr
    losses = cli_helpers.losses(result.stdout)
    assert len(losses) == 2 and all(0 < loss < 20 for loss in losses)


def test_a_hook_from_a_users_module_runs_at_its_period(small_data_dir, tmp_path, user_module):
    log = tmp_path / "losses.jsonl"
    result = _train(small_data_dir, tmp_path / "hooked", user_module, "train.hooks = [@LossLog()]",
                    f"LossLog.path = '{log}'")
    assert result.returncode == 0, result.stderr
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["step"] for e in entries] == [1, 2]
    assert [e["loss"] for e in entries] == pytest.approx(cli_helpers.losses(result.stdout), rel=1e-3)
