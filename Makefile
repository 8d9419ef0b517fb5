# Two commands do all set-up on a fresh machine (Python 3.11):
#   make quickstart   venv + pinned install + prepare the embedded corpus + train + eval + sample
#   make test         the full test suite, with CPU PyTorch + transformers (.ci/run calls exactly this)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DATA_DIR ?= data/python_stdlib

.PHONY: install quickstart data test clean

install: $(VENV)/.installed

# The lock holds every package at a tested version (t5 included, whose own metadata would pull
# in nightlies); installing it with --no-deps makes the environment exactly the tested one.
$(VENV)/.installed: requirements/lock.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements/lock.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# NVIDIA GPUs (CUDA 12): the CUDA plugin and runtime libraries pinned in requirements/gpu.txt,
# added to the locked environment with --no-deps (docs/gpu.md).
.PHONY: install-gpu
install-gpu: install
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements/gpu.txt

# Cloud TPU VMs: the TPU runtime (libtpu) pinned in requirements/tpu.txt, added to the locked
# environment with --no-deps; launch/tpu/install.sh runs this on every worker of a slice.
.PHONY: install-tpu
install-tpu: install
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements/tpu.txt

# CPU PyTorch and transformers with their runtime dependencies, pinned in requirements/torch.txt,
# added to the locked environment with --no-deps: the interop tests compare logits with
# transformers' models, and `python -m bench torch_reference` uses PyTorch.
.PHONY: install-torch
install-torch: $(VENV)/.installed-torch

$(VENV)/.installed-torch: requirements/torch.txt $(VENV)/.installed
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements/torch.txt
	touch $@

data: $(DATA_DIR)/metadata.json $(DATA_DIR)/train.index.npy

$(DATA_DIR)/metadata.json: | install
	$(BIN)/t5x-lite prepare --input=python_stdlib --out=$(DATA_DIR) --vocab_size=4096 --num_shards=4

# prepare writes the offset index; a directory prepared before it existed gets one here.
$(DATA_DIR)/train.index.npy: | $(DATA_DIR)/metadata.json
	$(BIN)/t5x-lite index $(DATA_DIR)

quickstart: install data
	$(BIN)/t5x-lite train --gin_file=runs/quickstart.gin --gin.DATA_DIR="'$(DATA_DIR)'"
	$(BIN)/t5x-lite eval --gin_file=runs/quickstart_eval.gin --gin.DATA_DIR="'$(DATA_DIR)'"
	$(BIN)/t5x-lite sample --model_dir=runs/quickstart --prompt="class " --max_new_tokens=96

# The generated configuration reference must match the code (and document every parameter).
# lint-imports checks the one-way imports (pyproject.toml's import-linter contracts) first.
.PHONY: install-tracking
install-tracking: $(VENV)/.installed-tracking

$(VENV)/.installed-tracking: requirements/tracking.txt $(VENV)/.installed-torch
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements/tracking.txt
	touch $@

test: install install-torch install-tracking
	$(BIN)/lint-imports
	$(BIN)/t5x-lite config reference --out=docs/config_reference.md --check
	$(BIN)/python -m pytest -q -n 2 tests

# For quick iteration: the tests that start no process (no CLI run, no prepare, no cluster).
.PHONY: test-fast
test-fast: install
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n 2 -m "not subprocess" tests

clean:
	rm -rf $(VENV) runs/quickstart
