"""Hugging Face interop: `t5x-lite convert from-hf` and `convert to-hf` (docs/interop.md).

safetensors_files.py reads and writes the tensor files (numpy, no PyTorch); config_json.py
reads config.json fields with errors by name; rules.py is the data-driven name mapping;
llama.py, gpt2.py and t5.py hold each family's config translation and rules; convert.py runs
a conversion either way; tokenizer.py makes a converted tokenizer.json a vocabulary; command.py
is the command line.
"""
