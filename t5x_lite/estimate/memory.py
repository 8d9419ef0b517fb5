"""Memory per device of the train step: by arithmetic, and (with `--compile`) XLA's own analysis.

The arithmetic sizes the real train state (`Trainer.abstract_state`, nothing allocated) under
each array's PartitionSpec, adds gradients and (under FSDP) the gathered whole weights, and
roughly sizes activations and logits from the remat policy. `compiled_memory` lowers and
compiles the real train step on the mesh and reads XLA's memory analysis, the number to plan
by on the target hardware.
"""

from __future__ import annotations

import math
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from t5x_lite.errors import ConfigValueError
from t5x_lite.estimate import arithmetic as estimate_math
from t5x_lite.estimate.layout import logical_shards, rules_for_mesh_shape
from t5x_lite.estimate.run_from_gin import RunSettings
from t5x_lite.models import stack
from t5x_lite.parallel import partitioning
from t5x_lite.training import trainer as trainer_lib


def example_batch(train_data: Any, rows: int) -> dict[str, Any]:
    """Zero int32 arrays with the features (and packing features) the train step receives."""
    shapes = dict(train_data.model_feature_shapes(rows))
    targets = shapes["decoder_input_tokens"]
    shapes.update(decoder_target_tokens=targets, decoder_loss_weights=targets)
    if train_data.pack:
        prefixes = ["decoder"] + (["encoder"] if "encoder_input_tokens" in shapes else [])
        for prefix in prefixes:
            length = shapes[f"{prefix}_input_tokens"]
            shapes.update({f"{prefix}_segment_ids": length, f"{prefix}_positions": length})
    return {name: np.zeros(shape, np.int32) for name, shape in shapes.items()}


def _trainer(settings: RunSettings, mesh: Any) -> Any:
    """The run's Trainer on `mesh`, built as `train` builds it."""
    total_steps = max(settings.train_steps or 1, 1)  # the schedule's length changes no shape
    return trainer_lib.Trainer.for_run(model=settings.model, optimizer=settings.optimizer, total_steps=total_steps,
                                       mesh=mesh, rules=settings.logical_axis_rules, loss=settings.loss,
                                       microbatches=settings.microbatches)


def optimizer_state_note(optimizer: Any) -> str:
    """What the optimizer keeps per parameter, for the report."""
    return optimizer.state_note()


def state_bytes_per_device(settings: RunSettings, mesh_shape: Mapping[str, int]) -> dict[str, Any]:
    """Bytes per device of parameters, optimizer state and step of the train state, by arithmetic.

    The state's shapes and logical partitioning come from `Trainer.abstract_state` (the same code
    the train loop uses, under jax.eval_shape: nothing is allocated) on a one-device mesh with
    the run's axis names; each array's mesh PartitionSpec is then applied to `mesh_shape`.
    Also returns the parameter tree's element count, as a check of `num_params()`, and which
    optimizer the state is of (`optimizer`: its name and what it keeps).
    """
    mesh = partitioning.make_mesh(axes=[(name, 1) for name in mesh_shape], devices=jax.devices()[:1])
    state = _trainer(settings, mesh).abstract_state(example_batch(settings.train_data, rows=1))

    def total(tree) -> int:
        return sum(estimate_math.per_device_elements(
            shape=leaf.shape, shards=estimate_math.spec_shards(leaf.sharding.spec, mesh_shape)) * leaf.dtype.itemsize
            for leaf in jax.tree.leaves(tree))

    unscanned, stacks = gathered_arrays(state.params, settings, mesh_shape)
    return {"params": total(state.params), "optimizer_state": total(state.opt_state), "step": total(state.step),
            "tree_params": sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state.params)),
            "optimizer": optimizer_state_note(settings.optimizer),
            "gathered": estimate_math.gathered_bytes(unscanned=unscanned, layer_stacks=list(stacks.values()))}


def gathered_arrays(params: Any, settings: RunSettings, mesh_shape: Mapping[str, int]) -> tuple[list[int], dict]:
    """(bytes per device of each unscanned parameter once gathered, {scanned stack: one layer's gathered bytes}).

    Only arrays sharded over a mesh axis that splits the batch (FSDP's axes) are gathered; they keep
    their other shards (tensor parallel), except token embedding tables (`embedding`), which the
    lookup (`jnp.take`) gathers whole. Arrays under a module named `layers` are scanned, their
    first axis the layer.
    """
    rules = rules_for_mesh_shape(settings.logical_axis_rules, mesh_shape)
    batch_axes = partitioning.batch_mesh_axes(rules)
    unscanned, stacks = [], {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        spec = tuple(leaf.sharding.spec)
        shards = estimate_math.spec_shards(estimate_math.without_axes(spec, batch_axes), mesh_shape)
        if shards == estimate_math.spec_shards(spec, mesh_shape):
            continue  # not sharded over a batch axis: used as it is stored
        keys = [str(getattr(k, "key", k)) for k in path]
        if keys[-1] == "embedding":
            shards = (1,) * len(leaf.shape)
        whole = estimate_math.per_device_elements(shape=leaf.shape, shards=shards) * leaf.dtype.itemsize
        if "layers" in keys:
            stack = "/".join(keys[:keys.index("layers") + 1])
            stacks[stack] = stacks.get(stack, 0) + whole // leaf.shape[0]
        else:
            unscanned.append(whole)
    return unscanned, stacks


ATTENTION_LABELS = {"cudnn": "cuDNN flash attention", "explicit": "explicit attention (float32 probabilities kept)",
                    "explicit_blas": "explicit attention on the fused CPU kernel (float32 probabilities kept)",
                    "xla": "XLA attention (scores kept)"}


def activations_estimate(settings: RunSettings, mesh_shape: Mapping[str, int], *,
                         attention: str, platform: str) -> dict[str, Any]:
    """Rough activation and logits bytes per device for the model, batch, mesh and remat policy,
    `attention` being the implementation the model runs (the config's `attention(platform)`) on `platform`."""
    model, data = settings.model, settings.train_data
    rules = rules_for_mesh_shape(settings.logical_axis_rules, mesh_shape)
    batch_shards, _, heads_shards, _ = logical_shards(("batch", "length", "heads", "kv"), rules, mesh_shape)
    mlp_shards = logical_shards(("batch", "length", "mlp"), rules, mesh_shape)[2]
    vocab_shards = logical_shards(("batch", "length", "vocab"), rules, mesh_shape)[2]
    rows = data.batch_size // batch_shards // settings.microbatches
    dtype_bytes = jnp.dtype(model.dtype).itemsize
    common = dict(policy=model.remat_policy, dtype_bytes=dtype_bytes, attention=attention,
                  saved_bytes=estimate_math.saved_activation_bytes(platform=platform, dtype_bytes=dtype_bytes,
                                                                   scanned=model.scan_layers))
    length = data.sequence_length
    device = host = 0.0
    for layers in model.activation_stacks(rows=rows, length=length, inputs_length=data.inputs_length):
        on_device, on_host = estimate_math.activation_bytes(
            num_layers=layers["num_layers"], tokens=layers["tokens"], width=layers["width"],
            mlp=layers["mlp"] / mlp_shards, n_mlp_in=layers["n_mlp_in"], q=layers["q"] / heads_shards,
            kv=layers["kv"] / heads_shards, scores=layers["scores"] / heads_shards,
            attention_blocks=layers.get("attention_blocks", 1), **common)
        device, host = device + on_device, host + on_host
    logits = estimate_math.logits_bytes(tokens=rows * length, vocab_size=model.vocab_size, vocab_shards=vocab_shards)
    return {"rows_per_device": rows, "remat_policy": model.remat_policy, "dtype": model.dtype,
            "attention": ATTENTION_LABELS[attention],
            "activations": device, "activations_host": host, "logits": logits}


def memory_estimate(settings: RunSettings, mesh_shape: Mapping[str, int], *, platform: str) -> dict[str, Any]:
    """Per-device bytes by arithmetic: the train state (exact), gradients, and rough activations and logits."""
    state = state_bytes_per_device(settings, mesh_shape)
    gradients = state["params"] * (1 if settings.microbatches == 1 else 2)  # + the accumulator
    train_state = state["params"] + state["optimizer_state"] + state["step"]
    acts = activations_estimate(settings, mesh_shape, attention=settings.model.attention(platform=platform),
                                platform=platform)
    return {"method": "arithmetic", **state, "gradients": gradients, "train_state": train_state,
            "state_total": train_state + gradients, **acts,
            "total": train_state + gradients + state["gathered"] + acts["activations"] + acts["logits"]}


def ensure_devices(num_devices: int) -> list[Any]:
    """The first `num_devices` JAX devices, or a clear error when JAX started with fewer."""
    devices = jax.devices()
    if len(devices) < num_devices:
        platform = devices[0].platform
        hint = ("JAX had already started; run the command in a fresh process" if platform == "cpu" else
                "compile on host CPU devices instead with JAX_PLATFORMS=cpu")
        raise ConfigValueError(f"--compile on --num_devices={num_devices} needs {num_devices} devices, but JAX has "
                               f"{len(devices)} {platform} device(s); {hint}, or lower --num_devices.")
    return devices[:num_devices]


def request_cpu_devices(num_devices: int) -> None:
    """Asks JAX for `num_devices` host CPU devices (what XLA_FLAGS=--xla_force_host_platform_device_count=N
    does); a no-op once JAX's backends have started (then `ensure_devices` checks the count)."""
    try:
        jax.config.update("jax_num_cpu_devices", num_devices)
    except RuntimeError:  # backends already initialised
        pass


def compile_train_step(settings: RunSettings, *, num_devices: int) -> tuple[Any, Any, float, int]:
    """(the compiled train step, its trainer, seconds to lower and compile, batch bytes per device)
    on the run's mesh over the first `num_devices` devices. Nothing runs and nothing is allocated:
    the state and batch are abstract."""
    devices = ensure_devices(num_devices)
    stack.check_backend_supports(settings.model.remat_policy, devices[0])
    mesh = partitioning.make_mesh(axes=settings.mesh_axes, devices=devices)
    trainer = _trainer(settings, mesh)
    batch = example_batch(settings.train_data, rows=settings.train_data.batch_size)
    start = time.perf_counter()
    compiled = trainer.lower_train_step(batch).compile()
    seconds = time.perf_counter() - start
    batch_bytes = sum(v.nbytes for v in batch.values()) // partitioning.num_batch_shards(mesh, trainer.rules)
    return compiled, trainer, seconds, batch_bytes


def compiled_memory(settings: RunSettings, *, num_devices: int) -> dict[str, Any]:
    """XLA's memory analysis per device of the real train step, lowered and compiled on the mesh.

    `total` is arguments + outputs - aliased (the donated state) + temp, the usual estimate of the peak.
    """
    compiled, _, seconds, batch_bytes = compile_train_step(settings, num_devices=num_devices)
    return {**trainer_lib.compiled_memory_bytes(compiled.memory_analysis()), "batch": batch_bytes,
            "device": f"{num_devices} x {jax.devices()[0].device_kind}", "lower_and_compile_seconds": round(seconds, 2)}
