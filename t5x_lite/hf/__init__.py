"""Hugging Face interop: `t5x-lite convert from-hf` and `convert to-hf` (docs/interop.md).

safetensors_files.py reads and writes the tensor files (numpy, no PyTorch); rules.py is the
data-driven name mapping; llama.py, gpt2.py and t5.py hold each family's config translation
and rules; convert.py runs a conversion either way; command.py is the command line.
"""
