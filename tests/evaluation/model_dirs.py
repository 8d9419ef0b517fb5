"""Model directories for evaluation tests: one checkpoint of given params, and the data's vocabulary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from t5x_lite.checkpoints import checkpoint
from tests.cli_helpers import VOCAB


def save_model_dir(path: Path, cfg, params_by_step: dict[int, Any], data_dir: Path) -> Path:
    """MODEL_DIR with a checkpoint of each step's params and data_dir's SentencePiece vocabulary."""
    checkpoints = checkpoint.Checkpointer(str(path), async_save=False)
    metadata = {"family": cfg.family, "model": json.loads(json.dumps(cfg.to_dict())), "task": "t",
                "vocab_size": VOCAB, "sequence_length": 64, "mesh_axes": [], "num_params": cfg.num_params()}
    for step, params in params_by_step.items():
        state = {"step": jnp.int32(step), "params": params, "opt_state": {}, "dropout_rng": jax.random.PRNGKey(0)}
        checkpoints.save(step, state=state, iterator_state={}, metadata=metadata)
    checkpoints.wait()
    checkpoints.close()
    (path / "vocab").mkdir()
    shutil.copy(data_dir / "spm.model", path / "vocab" / "spm.model")
    return path


def random_decoder_dir(path: Path, data_dir: Path, *, step: int = 5, seed: int = 3) -> Path:
    """A tiny decoder (width 32, 2 layers) with random params."""
    from t5x_lite.models import DecoderConfig

    cfg = DecoderConfig(vocab_size=VOCAB, emb_dim=32, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64,
                        num_layers=2, max_len=64)
    params = cfg.make_module().init(jax.random.PRNGKey(seed), jnp.zeros((1, 8), jnp.int32))["params"]
    return save_model_dir(path, cfg, {step: params}, data_dir)
