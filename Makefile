# One command runs the demo, one runs the tests; both build .venv from scratch when needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU build of torch; a GPU host sets TORCH_PIN (e.g. to a CUDA build of the same version).
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test install dev clean gpu-check

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# --no-compile: no bytecode for the thousands of torch files no test imports (~45 s less on 2 cores);
# what is imported is compiled on first import, as always.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --no-compile "$(TORCH_PIN)"
	$(BIN)/pip install -q --no-compile -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -q --no-compile -e ".[dev]"
	touch $@

install: $(VENV)/.installed
dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(BIN)/ddpviz up

# Three pytest-xdist workers, a module per worker at a time (module fixtures are built once): on
# this 2-core machine the suite spends much of its time waiting on rank processes, Redis, Chromium.
test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n 3 --dist loadscope

# On a CUDA host (.venv built with TORCH_PIN set to a CUDA build): `ddpviz doctor --gpu`, <= 8 minutes.
gpu-check: $(VENV)/.installed-dev
	bash scripts/gpu_check.sh $(GPU_OUT)

clean:
	rm -rf $(VENV) .ddpviz
