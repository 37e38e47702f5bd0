# One command runs the demo, one runs the tests; both build .venv from scratch when needed.

# Bytecode is written on first import, whatever the caller's shell says: with PYTHONDONTWRITEBYTECODE=1
# (set on this project's machines) and a --no-compile install, every process recompiled torch from
# source on every import: `import torch` 5.2 s instead of 1.8 s, a 5-step `ddpviz train` 14 s
# instead of 5 s, the rank fork server's imports 10.9 s instead of 4.7 s (measured 2026-12-01).
unexport PYTHONDONTWRITEBYTECODE
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# What pip installs torch from, as pip words: a requirement, then any options, unquoted, e.g.
#   make dev TORCH_PIN="torch==2.10.0 --index-url https://download.pytorch.org/whl/cu126"
# torch==2.13.0 is the CPU build on this project's machines (a local wheel); from PyPI on Linux
# x86_64 the same pin is the CUDA 13.0 build (needs an NVIDIA driver >= 580; torch 2.10.0 is PyPI's
# last CUDA 12 build: see docs/gpu/README.md). TORCH_PIN= (empty) keeps the torch already in .venv.
# A stamp named after the pin: a changed pin uninstalls the old torch and installs the new one.
TORCH_PIN ?= torch==2.13.0
TORCH_STAMP := $(VENV)/.torch-$(or $(shell printf '%s' '$(TORCH_PIN)' | tr -c 'A-Za-z0-9.=_-' '_'),keep)

.PHONY: demo test install dev clean gpu-check

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# --no-compile: no bytecode for the thousands of torch files no test imports (~45 s less on 2 cores);
# what is imported is compiled on first import and kept (see `unexport` above).
$(TORCH_STAMP): | $(BIN)/python
ifneq ($(strip $(TORCH_PIN)),)
	if ls $(VENV)/.torch-* >/dev/null 2>&1; then $(BIN)/pip uninstall -q -y torch; fi
	$(BIN)/pip install -q --no-compile $(TORCH_PIN)
endif
	rm -f $(VENV)/.torch-*
	touch '$@'

# The warm-up import writes the bytecode of torch, the app's libraries and ours once, at install: else the
# demo's first processes (worker, launcher, ranks) and `make test`'s four workers each compile what they import
# at the same moment (a new user's first pair after install sat ~75 s at "step 0 / 300" on a loaded 2-core VM,
# 2026-12-06; how much of it was compiling was not measured).
WARM_UP := $(BIN)/python -c "import ddpviz.workers.worker, ddpviz.engine.runner, torch._dynamo, torch.distributed.fsdp, streamlit, altair"

$(VENV)/.installed: pyproject.toml $(TORCH_STAMP) | $(BIN)/python
	$(BIN)/pip install -q --no-compile -e .
	$(WARM_UP)
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -q --no-compile -e ".[dev]"
	touch $@

install: $(VENV)/.installed
dev: $(VENV)/.installed-dev

# UP_ARGS: `ddpviz up`'s options, e.g. make demo UP_ARGS="--port 8502 --workers 2"
UP_ARGS ?=
demo: $(VENV)/.installed
	$(BIN)/ddpviz up $(UP_ARGS)

# Four pytest-xdist workers, a module per worker at a time (module fixtures are built once), the
# longest modules first (tests/conftest.py): on this 2-core machine the suite spends much of its
# time waiting on rank processes, Redis, Chromium (a fresh clone, 2026-12-02: 3 workers 544 s,
# 4 workers 499 s).
#
# OMP_NUM_THREADS=1: one intra-op thread in every process the suite starts that does not set its own
# (the engine sets each run's, engine.components.training.cpu_threads_per_rank; torchrun sets 1 for its
# workers). Four xdist workers and their subprocesses share 2 cores, and an idle OpenMP thread spins
# before it sleeps: a small model's 1,500 SGD steps took 4.25 s of CPU with 2 threads, 1.52 s with 1
# (2026-12-03); test_models + test_correctness 25.1 -> 19.5 s of CPU.
# The warm-up import again (above): a .venv installed before it was part of the install.
#
# Then the `quiet` tests, alone in one process: they judge this machine's real-time behaviour (a
# thread's GIL wait, the memory timer's latency, the all-reduce probe's fit), which the parallel
# run's own load distorts (each went red there once: pyproject.toml's markers).
test: $(VENV)/.installed-dev
	$(WARM_UP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 4 --dist loadscope -m "not quiet" --durations=12
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -p no:xdist -m quiet

# On a CUDA host (.venv built with TORCH_PIN set to a CUDA build): `ddpviz doctor --gpu`, <= 8 minutes.
# A host with its own torch and no package index: scripts/gpu_wheels.sh, then scripts/gpu_check.sh
# (docs/gpu/README.md).
GPU_OUT ?= ddpviz-doctor
gpu-check: $(VENV)/.installed-dev
	bash scripts/gpu_check.sh --system-python $(BIN)/python --out $(GPU_OUT)

clean:
	rm -rf $(VENV) .ddpviz
