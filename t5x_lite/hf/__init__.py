"""Hugging Face interop: `t5x-lite convert from-hf` and `convert to-hf` (docs/interop.md).

Owns:
  command.py            the command line of `convert from-hf | to-hf`
  convert.py            a conversion either way: config.json <-> model config, tensors <-> checkpoint
  safetensors_files.py  reads and writes the tensor files one tensor at a time (numpy, no PyTorch)
  config_json.py        config.json fields read with errors by field name (`require`, `choice`)
  special_tokens.py     the run's special tokens in an export: ids in config.json and
                        generation_config.json, their text in tokenizer_config.json
  rules.py              the name mapping as data: `Rule`, `Stack`, `Mapping`, `expand`
  families.py           which family module converts a config.json or a model config
  llama_like.py         what LLaMA, Mistral, Qwen2 and Gemma share: sizes, RoPE, the tensor mapping
                        (q/k/v biases included), refusals of config.json fields by name
  llama.py, mistral.py, qwen2.py, gemma.py  each LLaMA-shaped family's style and own config.json fields
  gpt2.py, t5.py        each family's config translation and rules
  errors.py             `ConversionError`, the one bad-input error of a conversion

A converted model's tokenizer (tokenizer.json or tokenizer.model) is read by data/vocab/hf_vocabulary.py
(checkpoints/ needs it, and may not import hf/); to-hf writes it back (convert.py `_write_tokenizer`) with
the run's special tokens (special_tokens.py).

Public names: `command.main` (cli.py); `convert.from_hf`, `convert.to_hf` and the family modules'
`mapping` are used by tests and docs only.

May import (pyproject.toml's layers contract): estimate, config, training, evaluation, inference,
checkpoints, data, parallel, metrics, models, storage, errors, tf_setup. Not cluster, its sibling
on the same layer.
"""
