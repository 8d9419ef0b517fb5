"""Compiles the train step of a tiny decoder and a tiny T5 under each shipped gin/mesh file (and
the 2x2x2 mesh) on 8 host devices, allocating nothing; prints one `compiled MODEL MESH` line each.

Run as a separate process (`python -m tests.parallel.compile_shipped_meshes`) with XLA's warnings
on (TF_CPP_MIN_LOG_LEVEL=0): tests/parallel/test_involuntary_remat.py reads its stderr.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = f"{os.environ.get('T5X_LITE_TEST_XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import gin  # noqa: E402 (after the environment is set)
import jax  # noqa: E402
import numpy as np  # noqa: E402

from t5x_lite.config import parsing as config_lib  # noqa: E402
from t5x_lite.models import decoder_only  # noqa: E402
from t5x_lite.parallel import partitioning  # noqa: E402
from t5x_lite.training import trainer as trainer_lib  # noqa: E402
from tests.parallel.test_parallelism import ADAMW, T5_CFG, make_enc_dec_batch  # noqa: E402

MESH_FILES = ("data_parallel", "fsdp", "fsdp_tensor")
DECODER_CFG = decoder_only.DecoderConfig(vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
                                         mlp_dim=64, num_layers=2, max_len=16)


def meshes() -> dict[str, tuple]:
    """{name: (MESH_AXES, LOGICAL_AXIS_RULES)} of every shipped mesh file, and 2x2x2 with the fsdp rules."""
    found = {}
    for name in MESH_FILES:
        try:
            config_lib.parse(gin_files=[f"mesh/{name}.gin"])
            found[name] = (gin.query_parameter("%MESH_AXES"), gin.query_parameter("%LOGICAL_AXIS_RULES"))
        finally:
            gin.clear_config()
    found["2x2x2"] = ((("data", 2), ("fsdp", 2), ("tensor", 2)), found["fsdp_tensor"][1])
    return found


def decoder_batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(2, DECODER_CFG.vocab_size, size=(8, 16)).astype(np.int32)
    inputs = np.zeros_like(tokens)
    inputs[:, 1:] = tokens[:, :-1]
    return {"decoder_input_tokens": inputs, "decoder_target_tokens": tokens,
            "decoder_loss_weights": np.ones(tokens.shape, np.float32)}


def main() -> None:
    models = {"decoder": (decoder_only.Decoder(DECODER_CFG), decoder_batch()),
              "t5": (T5_CFG.make_module(), make_enc_dec_batch())}
    for mesh_name, (axes, rules) in meshes().items():
        mesh = partitioning.make_mesh(axes=axes, devices=jax.devices())
        for model_name, (module, batch) in models.items():
            trainer = trainer_lib.Trainer(model=module, optimizer=ADAMW.build(30), learning_rate_fn=ADAMW.schedule(30),
                                          mesh=mesh, rules=rules, clip_grad_norm=ADAMW.clip_grad_norm)
            trainer.lower_train_step(batch).compile()
            print(f"compiled {model_name} {mesh_name}", flush=True)


if __name__ == "__main__":
    main()
