"""Conversions between a Hugging Face model folder and a t5x_lite model directory.

`from_hf`: config.json -> model config (scanned or not), every tensor checked against the
config's sizes before any is converted, then read one at a time and written as a step-0 Orbax
checkpoint of float32 parameters, with model.gin, the vocabulary (a SentencePiece model, when the
folder has one) and the folder's other files under hf/.

`to_hf`: a checkpoint's model config -> config.json, then each parameter array read alone from
the checkpoint (whatever mesh saved it) and its tensors streamed into safetensors files; the
tokenizer files of MODEL_DIR/hf/ are copied back, and the run's special tokens written into
config.json, generation_config.json and tokenizer_config.json (special_tokens.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from t5x_lite import storage
from t5x_lite.checkpoints import checkpoint, lookup, restored_model
from t5x_lite.checkpoints.init_from import flatten, unflatten
from t5x_lite.data.vocab import tokenizer_files
from t5x_lite.hf import families, rules, safetensors_files, special_tokens
from t5x_lite.hf.errors import ConversionError
from t5x_lite.models import BaseModel

CONFIG_FILE = "config.json"
HF_SUBDIR = "hf"  # in a converted model directory: the Hugging Face folder's non-weight files
MODEL_GIN = "model.gin"
# SentencePiece models as LLaMA and T5 folders name them.
SENTENCEPIECE_FILES = ("tokenizer.model", "spiece.model")
# The slow tokenizers' files (GPT-2's vocabulary and merges, added tokens) beside tokenizer.json.
OTHER_TOKENIZER_FILES = ("vocab.json", "merges.txt", "added_tokens.json", "vocab.txt")
WEIGHT_FILE = re.compile(r".*\.(safetensors|bin|pt|pth|h5|msgpack|ckpt|gguf)$|.*\.safetensors\.index\.json$")
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
OUTPUT_DTYPES = ("float32", "bfloat16", "float16")


def read_hf_config(model_dir: str) -> dict[str, Any]:
    path = os.path.join(model_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise ConversionError(f"{model_dir} has no {CONFIG_FILE}; --model_dir names a local Hugging Face model folder "
                              "(config.json + safetensors), as save_pretrained writes it.")
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ConversionError(f"{path} is not valid JSON ({e}).") from None


def abstract_params(model: Any) -> dict[str, Any]:
    """{'/'-joined parameter path: ShapeDtypeStruct} of `model`, without allocating it."""

    inputs = {k: jnp.zeros(v.shape, v.dtype) for k, v in model.init_inputs().items()}
    return flatten(jax.eval_shape(model.make_module().init, jax.random.key(0), **inputs)["params"])


def check_tensors(steps: list[rules.Step], files: safetensors_files.TensorFiles, mapping: rules.Mapping,
                  dims: dict[str, Any]) -> None:
    """Every tensor the rules need is present with the shape config.json gives it, and no other
    tensor is left unconverted; one ConversionError lists the problems by tensor name."""
    problems, needed = [], set()
    for step in steps:
        for name, shape, exprs in zip(step.hf, step.hf_shapes, step.shape_exprs):
            needed.add(name)
            if name not in files:
                problems.append(f"missing tensor {name}")
            elif files.shape(name) != shape:
                problems.append(f"tensor {name} has shape {list(files.shape(name))}, but config.json gives "
                                f"{rules.describe_shape(exprs, dims)}")
    ignored = [re.compile(p) for p in mapping.ignored]
    unexpected = [n for n in files.names() if n not in needed and not any(p.fullmatch(n) for p in ignored)]
    problems += [f"unexpected tensor {n} (not part of this architecture; it would be dropped)" for n in unexpected]
    if problems:
        raise ConversionError(f"{files.folder} does not match its config.json:\n  " + "\n  ".join(problems[:20])
                              + (f"\n  ... {len(problems) - 20} more" if len(problems) > 20 else ""))


def model_gin(model: Any, *, header: str) -> str:
    """A gin file binding MODEL to `model`'s every field."""
    cls = type(model).__name__
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines.append(f"MODEL = @{cls}()")
    lines += [f"{cls}.{field} = {value!r}" for field, value in model.to_dict().items()]
    return "\n".join(lines) + "\n"


def from_hf(model_dir: str, out: str, *, scan_layers: bool = True, log: Callable[[str], None] = print) -> str:
    """Converts the Hugging Face folder `model_dir` into the t5x_lite model directory `out`; returns model.gin's path."""

    hf_config = read_hf_config(model_dir)
    family = families.for_hf_config(hf_config)
    dims = family.dims(hf_config)
    model = family.config_from_hf(hf_config, scan_layers=scan_layers)
    out = storage.absolute(out)
    existing = checkpoint.Checkpointer(out, read_only=True) if storage.exists(checkpoint.checkpoints_dir(out)) else None
    if existing is not None:
        steps_there = existing.all_steps()
        existing.close()
        if steps_there:
            raise ConversionError(f"{out} already holds checkpoints (steps {steps_there}); nothing was written. "
                                  "Choose a new --out.")

    with safetensors_files.TensorFiles(model_dir) as files:
        mapping = family.mapping(model, set(files.names()))
        steps = rules.expand(mapping, scanned=model.scan_layers, dims=dims)
        check_tensors(steps, files, mapping, dims)
        params = _params_from_tensors(steps, files, abstract_params(model))

    storage.makedirs(out)
    _copy_folder_files(model_dir, out)
    gin_path = storage.join(out, MODEL_GIN)
    header = (f"A {family.ARCHITECTURE} converted from {os.path.abspath(model_dir)} by `t5x-lite convert from-hf`.\n"
              f"Fine-tune from it: --gin_file={gin_path} --gin.train.init_from=\"@InitFrom()\" "
              f"--gin.InitFrom.checkpoint=\"'{out}'\"")
    gin_text = model_gin(model, header=header)
    storage.write_whole(gin_path, gin_text)
    storage.write_whole(storage.join(out, "config.gin"), gin_text)
    metadata = {**model.metadata(), "task": None,
                "vocab_size": model.vocab_size, "num_params": model.num_params(),
                "converted_from": {"model_dir": os.path.abspath(model_dir), "architecture": family.ARCHITECTURE}}
    # Written last: a model directory with a checkpoint is a complete conversion.
    writer = checkpoint.Checkpointer(out, async_save=False)
    try:
        writer.save(0, state={"step": np.int32(0), "params": unflatten(params)}, iterator_state={},
                    metadata=metadata, config_text=gin_text)
    finally:
        writer.close()
    log(f"Converted {family.ARCHITECTURE} ({model.num_params():,} parameters, scan_layers={model.scan_layers}) "
        f"from {model_dir} to {out} (step 0).")
    return gin_path


def _params_from_tensors(steps: list[rules.Step], files: safetensors_files.TensorFiles,
                         abstract: dict[str, Any]) -> dict[str, np.ndarray]:
    params: dict[str, np.ndarray] = {}
    for step in steps:
        arrays = [np.asarray(files.read(name), dtype=np.float32) for name in step.hf]
        for path, value in zip(step.ours, step.transform.to_ours(*arrays)):
            want = abstract[path].shape
            if step.layer is None:
                params[path] = np.ascontiguousarray(value)
                got = value.shape
            else:
                params.setdefault(path, np.empty(want, np.float32))[step.layer] = value
                got = (want[0], *value.shape)
            if tuple(got) != tuple(want):
                raise AssertionError(f"{path}: converted to {got}, the model wants {want}")
    missing = sorted(set(abstract) - set(params))
    if missing:
        raise AssertionError(f"no rule fills {missing}")
    return params


def _copy_folder_files(model_dir: str, out: str) -> None:
    """The folder's config, tokenizer and generation files to out/hf/; its SentencePiece model to vocab/spm.model."""

    names = [n for n in sorted(os.listdir(model_dir))
             if os.path.isfile(os.path.join(model_dir, n)) and not WEIGHT_FILE.fullmatch(n)]
    storage.makedirs(storage.join(out, HF_SUBDIR))
    for name in names:
        storage.copy(os.path.join(model_dir, name), storage.join(out, HF_SUBDIR, name))
    spm = next((n for n in SENTENCEPIECE_FILES if n in names), None)
    if spm:
        storage.makedirs(storage.join(out, "vocab"))
        storage.copy(os.path.join(model_dir, spm), storage.join(out, "vocab", "spm.model"))


def to_hf(checkpoint_path: str, out: str, *, step: int | None = None, dtype: str = "float32",
          max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, log: Callable[[str], None] = print) -> list[str]:
    """Writes the checkpoint `checkpoint_path` (a model directory or a step directory) as a Hugging
    Face folder `out` (config.json, safetensors, the tokenizer files of MODEL_DIR/hf/, and the run's
    special tokens in config.json, generation_config.json and tokenizer_config.json); returns the
    weight files."""

    if dtype not in OUTPUT_DTYPES:
        raise ConversionError(f"--dtype={dtype!r}; choose one of {list(OUTPUT_DTYPES)}.")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ConversionError(f"{out} already exists and is not empty; nothing was written. Choose a new --out.")
    try:
        model_dir, step = lookup.locate(checkpoint_path, step)
    except lookup.CheckpointNotFoundError as e:
        raise ConversionError(str(e)) from None
    reader = checkpoint.Checkpointer(model_dir, read_only=True)
    try:
        metadata = reader.metadata(step)
        model = BaseModel.from_metadata(metadata["family"], metadata["model"])
        base = _hf_base_config(model_dir)
        vocabulary = restored_model.run_vocabulary(model_dir)
        ids = special_tokens.run_ids(model, vocabulary)
        family = families.for_model(model, prefer=base.get("model_type"))
        hf_config = special_tokens.merged({**base, **family.config_to_hf(model), "dtype": dtype, "torch_dtype": dtype},
                                          ids)
        dims = family.dims(hf_config)
        mapping = family.mapping(model)
        steps = rules.expand(mapping, scanned=model.scan_layers, dims=dims)
        saved_shapes = reader.state_shapes(step)["params"]
        _check_checkpoint_shapes(saved_shapes, abstract_params(model), model_dir, step)
        out_dtype = np.dtype(safetensors_files.DTYPES[{"float32": "F32", "bfloat16": "BF16", "float16": "F16"}[dtype]])
        specs = [safetensors_files.TensorSpec(name, shape, out_dtype)
                 for s in steps for name, shape in zip(s.hf, s.hf_shapes)]
        partial = f"{out.rstrip('/')}.partial"  # an interrupted conversion's leftovers are replaced
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        try:
            files = safetensors_files.write(partial, specs, _tensors_from_checkpoint(steps, reader, step, saved_shapes, out_dtype),
                                            max_shard_bytes=max_shard_bytes)
            with open(os.path.join(partial, CONFIG_FILE), "w") as f:
                json.dump(hf_config, f, indent=2, sort_keys=True)
            tokenizer_note = _write_tokenizer(model_dir, partial)
            special_tokens.write_generation_config(partial, ids)
            if vocabulary is not None and tokenizer_files.model_dir_tokenizer(model_dir) is not None:
                special_tokens.write_tokenizer_config(partial, vocabulary, ids)
            if os.path.isdir(out):
                os.rmdir(out)  # empty (checked above)
            os.rename(partial, out)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    finally:
        reader.close()
    log(f"Wrote {family.ARCHITECTURE} ({len(specs)} tensors, {dtype}, {len(files)} file(s)) from {model_dir} "
        f"step {step} to {out}. {tokenizer_note}")
    return files


def _hf_base_config(model_dir: str) -> dict[str, Any]:
    """A converted directory's original config.json (fields t5x_lite does not model; its token ids are kept
    where they name the run's tokens: special_tokens.merged)."""

    path = storage.join(model_dir, HF_SUBDIR, CONFIG_FILE)
    if not storage.exists(path):
        return {}
    with storage.open(path, "rb") as f:
        config = json.load(f)
    # transformers' bookkeeping, rewritten by whichever version loads the folder.
    for key in ("transformers_version", "_name_or_path"):
        config.pop(key, None)
    return config


def _check_checkpoint_shapes(saved: Any, abstract: dict[str, Any], model_dir: str, step: int) -> None:
    problems = checkpoint.structure_differences(saved, unflatten(abstract), limit=20)
    if problems:
        raise ConversionError(f"The checkpoint at step {step} in {model_dir} does not match its own model config:\n  "
                              + "\n  ".join(problems))


def _tensors_from_checkpoint(steps: list[rules.Step], reader: Any, step: int, saved_shapes: Any,
                             dtype: np.dtype) -> Iterator[tuple[str, np.ndarray]]:
    """Each step's tensors in order; a scanned array is read once and kept while its layers are converted."""

    held: dict[str, np.ndarray] = {}
    for s in steps:
        if set(held) != set(s.ours):
            wanted = set(s.ours)
            held = {k: np.asarray(v) for k, v in flatten(reader.restore_params(step, only=wanted.__contains__,
                                                                          shapes=saved_shapes)).items()}
        arrays = [held[p] if s.layer is None else held[p][s.layer] for p in s.ours]
        for name, shape, tensor in zip(s.hf, s.hf_shapes, s.transform.to_hf(*arrays)):
            if tuple(tensor.shape) != shape:
                raise AssertionError(f"{name}: converted to {tensor.shape}, expected {shape}")
            yield name, np.asarray(tensor).astype(dtype)


def _write_tokenizer(model_dir: str, folder: str) -> str:
    """The model directory's Hugging Face files (hf/: a from-hf conversion's, or those a run trained on
    such a tokenizer keeps) copied as they came, config.json aside; returns what was done.

    When hf/'s tokenizer is not the model's (a run trained on a vocabulary of `t5x-lite prepare`
    that started from a conversion: tokenizer_files.model_dir_tokenizer), its tokenizer files are
    left out. A vocabulary that t5x-lite prepare trained is not written either: transformers'
    SentencePiece-based tokenizer classes assume other normalisation settings (a dummy prefix,
    whitespace handling) and would give other token ids than the model was trained on.
    """

    hf_dir = storage.join(model_dir, HF_SUBDIR)
    if not storage.exists(hf_dir):
        return (f"No tokenizer written: {model_dir} has no Hugging Face tokenizer files ({HF_SUBDIR}/ of a from-hf "
                "conversion or of a run on such a tokenizer); its SentencePiece vocabulary, if any, is "
                "vocab/spm.model.")
    names = [name.rstrip("/") for name in storage.listdir(hf_dir)]
    own = tokenizer_files.model_dir_tokenizer(model_dir) is not None
    tokenizer_names = {tokenizer_files.TOKENIZER_JSON, *tokenizer_files.SENTENCEPIECE_FILES,
                       *tokenizer_files.TOKEN_NAME_FILES, *OTHER_TOKENIZER_FILES}
    copied = [n for n in names if n != CONFIG_FILE and (own or n not in tokenizer_names)]
    for name in copied:
        storage.copy(storage.join(hf_dir, name), os.path.join(folder, name))
    note = f"Tokenizer and generation files copied from {hf_dir}: {sorted(copied)}."
    if not own and any(n in tokenizer_names for n in names):
        note += (f" Its tokenizer was left out: the model's vocabulary is {model_dir}/vocab/spm.model, a "
                 "SentencePiece model of `t5x-lite prepare`.")
    return note
