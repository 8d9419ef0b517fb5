"""The infer loop: prompts (a jsonl file or a task's split) -> a jsonl file of outputs.

The prompts are cut into chunks of `chunk_size`; chunk c belongs to shard c % num_shards
(one shard per process, or per independently launched job). Each finished chunk is written
whole to OUTPUT.parts/chunk-<c>.jsonl, so a killed run started again skips the chunks it
finished and writes no line twice. Whichever shard finishes the last chunk joins them, in
prompt order, into OUTPUT. OUTPUT.parts/manifest.json pins what the chunks were made from
(the prompts, the checkpoint step, the decoding settings): resuming with different ones is
an error rather than a file that mixes two runs.

Each process decodes its own chunks on a mesh of its own devices (data parallel when the model
fits on one device, FSDP over the host's devices when it does not, or the given MESH_AXES),
so the processes never wait for each other.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Sequence

import jax

from t5x_lite import storage
from t5x_lite.checkpoints import lookup, restored_model
from t5x_lite.data import task_access, task_modules
from t5x_lite.data.vocab import tokenizer_files
from t5x_lite.errors import ConfigValueError, TaskDataError
from t5x_lite.inference import predict
from t5x_lite.inference import prompts as prompts_lib
from t5x_lite.models import BaseModel


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One prompt: its token ids and the record its output line starts from."""

    tokens: list[int]
    record: dict[str, Any]


def chunk_ranges(num_prompts: int, chunk_size: int) -> list[tuple[int, int]]:
    """[begin, end) of each chunk of prompts."""
    return [(begin, min(begin + chunk_size, num_prompts)) for begin in range(0, num_prompts, chunk_size)]


def shard_chunks(num_chunks: int, *, shard_index: int, num_shards: int) -> list[int]:
    """The chunks of one shard: every num_shards-th, starting at shard_index."""
    if not 0 <= shard_index < num_shards:
        raise ConfigValueError(f"shard_index={shard_index} must be in [0, num_shards={num_shards}).")
    return list(range(shard_index, num_chunks, num_shards))


def parts_dir(output: str) -> str:
    return f"{output}.parts"


def chunk_path(output: str, chunk: int) -> str:
    return storage.join(parts_dir(output), f"chunk-{chunk:06d}.jsonl")


def read_jsonl_prompts(path: str, *, prompt_field: str, encode) -> list[Prompt]:
    """Every line of a jsonl file as a prompt: a JSON object with the text in `prompt_field`, made ids by
    `encode` (infer passes `prompts.encode_prompt` for the model: an encoder-decoder's end with EOS)."""
    if not storage.exists(path):
        raise TaskDataError(f"The prompts file {path!r} does not exist.")
    prompts = []
    with storage.open(path, "r") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise TaskDataError(f"{path}, line {number}: not valid JSON ({e}).") from None
            if not isinstance(record, dict) or not isinstance(record.get(prompt_field), str):
                raise TaskDataError(f"{path}, line {number}: expected a JSON object with a string field "
                                    f"{prompt_field!r} (set infer.prompt_field to the field holding the prompt).")
            prompts.append(Prompt(tokens=list(encode(record[prompt_field])), record=record))
    if not prompts:
        raise TaskDataError(f"The prompts file {path!r} has no prompts.")
    return prompts


def task_prompts(mixture_or_task_name: str, split: str, model: BaseModel) -> tuple[list[Prompt], Any]:
    """A task split's `inputs` as prompts (records carry the inputs and targets text), and its vocabulary.

    The ids are those the task's preprocessors make, as in training; when they end otherwise than
    `prompts.encode_prompt` ends a prompt's text for `model`, a note says so (prompts.task_encoding_note)."""

    if "inputs" not in task_access.task_features(mixture_or_task_name):
        raise TaskDataError(f"Task {mixture_or_task_name!r} has no 'inputs' feature to use as prompts; use a "
                            "text-to-text task, or a jsonl file of prompts (infer.prompts_file).")
    task = task_access.get_task(mixture_or_task_name)
    vocabulary = task.output_features["targets"].vocabulary
    note = prompts_lib.task_encoding_note(model, mixture_or_task_name, bool(task.output_features["inputs"].add_eos))
    if note and jax.process_index() == 0:
        print(note, flush=True)
    dataset = task.get_dataset(sequence_length=None, split=split, shuffle=False, num_epochs=1)
    prompts = []
    for index, example in enumerate(dataset.as_numpy_iterator()):
        record = {"index": index, "inputs": vocabulary.decode(example["inputs"].tolist())}
        if "targets" in example:
            record["targets"] = vocabulary.decode(example["targets"].tolist())
        prompts.append(Prompt(tokens=example["inputs"].tolist(), record=record))
    if not prompts:
        raise TaskDataError(f"The {split} split of {mixture_or_task_name!r} is empty; nothing to infer.")
    return prompts, vocabulary


def infer(
    *,
    model_dir: str | None,
    output: str | None = None,
    output_dir: str | None = None,
    prompts_file: str | None = None,
    prompt_field: str = "prompt",
    mixture_or_task_name: str | None = None,
    split: str = "validation",
    step: int | None = None,
    chunk_size: int = 64,
    batch_size: int = 8,
    decoding: predict.DecodingConfig = predict.DecodingConfig(),
    task_feature_lengths: Mapping[str, int] | None = None,
    shard_index: int | None = None,
    num_shards: int | None = None,
    model: BaseModel | None = None,
    task_module: str | None = None,
    mesh_axes: Sequence[tuple[str, int]] | None = None,
    logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
) -> dict[str, int]:
    """Writes one output line per prompt to `output`; returns counts of chunks written and skipped.

    Args:
      model_dir: a training run's MODEL_DIR (or a step directory MODEL_DIR/checkpoints/<step>).
      output: the jsonl file to write (local, gs:// or s3://).
      output_dir: instead of `output`, a directory (t5x's INFER_OUTPUT_DIR): the file is
        OUTPUT_DIR/<task name or prompts file's name>.jsonl.
      prompts_file: a jsonl file of prompts (one JSON object per line); its lines are copied
        to the output with an "output" field added.
      prompt_field: the field of each line that holds the prompt text.
      mixture_or_task_name: instead of prompts_file, a registered task whose `inputs` are the
        prompts (the output lines carry index, inputs, targets and output).
      split: the task's split.
      step: the checkpoint step (None: the latest; a resumed run keeps the step it started with).
      chunk_size: prompts per chunk file, the unit of resumption and of sharding.
      batch_size: prompts per decoding call.
      decoding: how to generate (predict.DecodingConfig).
      task_feature_lengths: t5x's TASK_FEATURE_LENGTHS; its 'targets' sets the decoding's
        max_decode_length (its 'inputs' is the model's to check, as for every prompt).
      shard_index: this process's shard (None: jax.process_index()).
      num_shards: how many shards share the prompts (None: jax.process_count()).
      model: a model config to check the checkpoint against (None: the checkpoint's own).
      task_module: a module of seqio task registrations to import first.
      mesh_axes: the mesh of this process's devices the params are sharded over (a gin/mesh
        file's MESH_AXES); None: data parallel when the model fits on one device, else FSDP.
      logical_axis_rules: the rule table (LOGICAL_AXIS_RULES); None: partitioning.DEFAULT_RULES.
    """
    lookup.require_model_dir(model_dir, "infer")
    if (output is None) == (output_dir is None):
        raise ConfigValueError("Set exactly one of OUTPUT (infer.output, the jsonl file to write) and "
                               "INFER_OUTPUT_DIR (infer.output_dir, a directory for it).")
    if (prompts_file is None) == (mixture_or_task_name is None):
        raise ConfigValueError("Set exactly one of infer.prompts_file (a jsonl of prompts) and "
                               "infer.mixture_or_task_name (a task whose inputs are the prompts).")
    if chunk_size < 1 or batch_size < 1:
        raise ConfigValueError(f"chunk_size={chunk_size} and batch_size={batch_size} must be at least 1.")
    if task_feature_lengths is not None:
        targets = (task_feature_lengths or {}).get("targets") if isinstance(task_feature_lengths, Mapping) else None
        if not (isinstance(targets, int) and targets > 0):
            raise ConfigValueError(f"TASK_FEATURE_LENGTHS={task_feature_lengths!r} needs a positive 'targets' "
                                   "length (the longest output decoded), e.g. {'inputs': 512, 'targets': 128}.")
        decoding = dataclasses.replace(decoding, max_decode_length=targets)
    if output is None:
        name = mixture_or_task_name or os.path.splitext(os.path.basename(prompts_file.rstrip("/")))[0]
        output = storage.join(output_dir, f"{name}.jsonl")
    _check_output(output)
    shard_index, num_shards = _shard(shard_index, num_shards)
    if task_module:
        task_modules.import_task_module(task_module)
    manifest = _read_manifest(output)
    if step is None and manifest is not None:
        step = manifest["step"]
    restored = restored_model.restore(model_dir, step=step, expected=model, mesh_axes=mesh_axes,
                                      rules=logical_axis_rules, local=True)
    if jax.process_index() == 0:
        each = " in each process" if jax.process_count() > 1 else ""
        print(f"decoding on {restored.placement.describe()}{each}", flush=True)
    if prompts_file is not None:
        vocabulary = restored.vocabulary()
        prompts = read_jsonl_prompts(prompts_file, prompt_field=prompt_field,
                                     encode=lambda text: prompts_lib.encode_prompt(restored.config, vocabulary, text))
        what = f"{prompts_file}: prompt"
    else:
        prompts, vocabulary = task_prompts(mixture_or_task_name, split, restored.config)
        what = f"{mixture_or_task_name} {split}: example"
    predict.check_prompt_lengths(restored.config, [p.tokens for p in prompts], what=what)
    pinned = {
        "model_dir": restored.model_dir, "step": restored.step, "prompts": prompts_file or mixture_or_task_name,
        "split": None if prompts_file else split, "num_prompts": len(prompts), "chunk_size": chunk_size,
        "decoding": dataclasses.asdict(decoding)}
    if prompts_file is not None and prompts_lib.inputs_end_with_eos(restored.config):
        # Chunks of a run whose prompts were read without EOS are not resumed with ones read with it.
        pinned["prompt_encoding"] = prompts_lib.describe(restored.config)
    _pin_manifest(output, manifest, pinned)

    chunks = chunk_ranges(len(prompts), chunk_size)
    counts = {"written": 0, "skipped": 0}
    for chunk in shard_chunks(len(chunks), shard_index=shard_index, num_shards=num_shards):
        if storage.exists(chunk_path(output, chunk)):
            counts["skipped"] += 1
            continue
        begin, end = chunks[chunk]
        lines = _infer_chunk(restored, prompts[begin:end], vocabulary, decoding=decoding, batch_size=batch_size,
                             first_batch=begin // batch_size)
        storage.write_whole(chunk_path(output, chunk), "".join(lines))
        counts["written"] += 1
        print(f"chunk {chunk + 1}/{len(chunks)}: prompts {begin}-{end - 1} written", flush=True)
    if jax.process_count() > 1:
        print(f"process {jax.process_index()}: computed {restored.placement.rows_computed} rows in "
              f"{restored.placement.batches_run} batches on {restored.placement.describe()}", flush=True)
    if all(storage.exists(chunk_path(output, c)) for c in range(len(chunks))):
        _join_chunks(output, len(chunks))
        print(f"wrote {len(prompts)} outputs to {output}", flush=True)
    else:
        print(f"shard {shard_index}/{num_shards} done; {output} is joined when every shard has finished", flush=True)
    return counts


def _check_output(output: str) -> None:
    """Where infer writes, checked before the model is restored (as train checks MODEL_DIR): a local OUTPUT is a
    file whose folder, or the nearest existing one above it, and OUTPUT.parts if it exists, this user can write.
    Reads, never writes; an object store's errors name themselves when it is written."""
    if storage.is_url(output):
        return
    if os.path.isdir(output):
        raise ConfigValueError(f"OUTPUT {output!r} is a directory; name the jsonl file to write, or set "
                               "INFER_OUTPUT_DIR to the directory instead.")
    existing = storage.nearest_existing(os.path.dirname(os.path.abspath(output)))
    for folder in [existing, *([parts_dir(output)] if os.path.exists(parts_dir(output)) else [])]:
        if not os.path.isdir(folder):
            raise ConfigValueError(f"OUTPUT {output!r} cannot be written: {folder!r} is a file, not a directory; "
                                   "choose an OUTPUT whose parent folders are directories.")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigValueError(f"{folder!r}, where OUTPUT {output!r} is written, is not writable by this user "
                                   "(its permissions, or a read-only file system); choose an OUTPUT (or "
                                   "INFER_OUTPUT_DIR) you can write to.")


def _shard(shard_index: int | None, num_shards: int | None) -> tuple[int, int]:
    if (shard_index is None) != (num_shards is None):
        raise ConfigValueError("Set both infer.shard_index and infer.num_shards, or neither (one shard per "
                               "JAX process).")
    if shard_index is None:
        return jax.process_index(), jax.process_count()
    return shard_index, num_shards


def _infer_chunk(restored: restored_model.RestoredModel, prompts: Sequence[Prompt], vocabulary, *,
                 decoding: predict.DecodingConfig, batch_size: int, first_batch: int) -> list[str]:
    # The batch's number in the whole run seeds its sampling, so a resumed run samples the same.
    outputs = predict.predict(model=restored.config, params=restored.params, prompts=[p.tokens for p in prompts],
                              decoding_config=decoding, eos_id=vocabulary.eos_id, batch_size=batch_size,
                              first_batch=first_batch, placement=restored.placement,
                              bos_id=tokenizer_files.decoder_start_id(vocabulary),
                              zero_is_token=tokenizer_files.zero_is_token(vocabulary))
    return [json.dumps({**p.record, "output": vocabulary.decode(tokens)}, ensure_ascii=False) + "\n"
            for p, tokens in zip(prompts, outputs)]


def _read_manifest(output: str) -> dict | None:
    path = storage.join(parts_dir(output), "manifest.json")
    if not storage.exists(path):
        return None
    with storage.open(path, "r") as f:
        return json.load(f)


def _pin_manifest(output: str, saved: dict | None, current: dict) -> None:
    """Writes the manifest of a new run, or checks that a resumed run matches it."""
    if saved is None:
        storage.makedirs(parts_dir(output))
        storage.write_whole(storage.join(parts_dir(output), "manifest.json"), json.dumps(current, indent=2))
        return
    differs = [f"{k}: before {saved.get(k)!r}, now {v!r}" for k, v in current.items() if saved.get(k) != v]
    if differs:
        raise ConfigValueError(
            f"{parts_dir(output)} holds chunks of an inference run with other settings:\n  " + "\n  ".join(differs)
            + f"\nRun with the same settings to resume it, or choose another output (or delete {parts_dir(output)}) "
            "to start afresh. Nothing was written.")


def _join_chunks(output: str, num_chunks: int) -> None:
    parts = []
    for chunk in range(num_chunks):
        with storage.open(chunk_path(output, chunk), "r") as f:
            parts.append(f.read())
    storage.write_whole(output, "".join(parts))
