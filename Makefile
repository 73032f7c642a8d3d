# Two commands on a fresh machine:  make demo  (the CPU demo)  and  make test  (the test suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# CPU machines take the CPU wheel of torch (a CUDA build is several GB); see README for GPUs.
TORCH_SPEC ?= torch==2.13.0

# The Slurm tests need a cluster: slurm/local/up.sh installs and starts a single-node one (root,
# Debian, no systemd needed). `make test SLURM=` skips starting it, and those tests skip too.
SLURM ?= slurm/local/up.sh
# The browser tests need Debian's chromium and chromedriver; `make test BROWSER=` skips them.
BROWSER ?= tests/e2e/install_chromium.sh

.PHONY: setup demo test lint bench bench-diagnosis bench-faults clean

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
	$(if $(SLURM),$(SLURM))
	$(if $(BROWSER),$(BROWSER))
	HYPRUN_REQUIRE_SLURM=$(if $(SLURM),1,0) HYPRUN_REQUIRE_BROWSER=$(if $(BROWSER),1,0) \
		$(BIN)/python -m pytest -q tests

bench: setup
	$(BIN)/python bench/overhead.py

bench-diagnosis: setup
	$(BIN)/python -m bench.diagnosis

bench-faults: setup
	$(BIN)/python -m bench.faults

clean:
	rm -rf $(VENV) .hyprun mlflow.db mlruns
