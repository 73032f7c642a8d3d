# Two commands on a fresh machine:  make demo  (the CPU demo)  and  make test  (the test suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# CPU machines take the CPU wheel of torch (a CUDA build is several GB); see README for GPUs.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo test lint bench clean

$(BIN)/hyprun: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(BIN)/hyprun

setup: $(BIN)/hyprun

demo: setup
	$(BIN)/hyprun demo

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q tests

bench: setup
	$(BIN)/python bench/overhead.py

clean:
	rm -rf $(VENV) .hyprun mlflow.db mlruns
