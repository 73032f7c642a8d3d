# Two commands on a fresh machine:  make demo  (the CPU demo)  and  make test  (the test suite).
# While developing: make test-fast (no Slurm, no browser, no multi-minute jobs; under 3 minutes).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# CPU machines take the CPU wheel of torch (a CUDA build is several GB); see README for GPUs.
TORCH_SPEC ?= torch==2.13.0

# The Slurm tests need a cluster: slurm/local/up.sh installs and starts a single-node one (root,
# Debian, no systemd needed); up_two_nodes.sh starts it and beside it two nodes in network
# namespaces (the multi-node tests). `make test SLURM=` skips starting them; those tests skip too.
SLURM ?= slurm/local/up_two_nodes.sh
# The browser tests need Debian's chromium and chromedriver; `make test BROWSER=` skips them.
BROWSER ?= tests/e2e/install_chromium.sh
# pytest-xdist workers (the Slurm and browser tests keep to one worker each: tests/conftest.py).
# Two by default: much of the suite waits on Slurm, servers and process starts, and on 2 cores
# CI's serial run had not finished in 87 min, where -n 2 took 48 min on a clean clone (idle,
# 2026-12-02). `make test PARALLEL=` runs it serially.
PARALLEL ?= -n 2 --dist loadgroup
FAST := -m "not slow and not slurm and not browser"
# The browser tests' screenshots (what a user sees in the MLflow UI): CI keeps this folder.
HYPRUN_SCREENSHOTS ?= .hyprun/screenshots

.PHONY: setup demo test test-fast lint bench bench-commands bench-demo bench-diagnosis bench-truth bench-verdicts bench-split bench-apps \
	bench-faults bench-threads gpu-check clean

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
	$(BIN)/ruff format --check .
	$(if $(SLURM),$(SLURM))
	$(if $(BROWSER),$(BROWSER))
	HYPRUN_REQUIRE_SLURM=$(if $(SLURM),1,0) HYPRUN_REQUIRE_BROWSER=$(if $(BROWSER),1,0) \
		HYPRUN_SCREENSHOTS=$(abspath $(HYPRUN_SCREENSHOTS)) \
		$(BIN)/python -m pytest -q tests $(PARALLEL) --durations=15

# The fast tier runs on every core by default (2 cores, idle: 250 s serial, 163 s with -n 2).
test-fast: PARALLEL = -n auto --dist loadgroup
test-fast: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q tests $(FAST) $(PARALLEL) --durations=15

bench: setup
	$(BIN)/python -m bench.overhead

bench-commands: setup
	$(BIN)/python -m bench.commands

bench-demo: setup
	$(BIN)/python -m bench.demo_time

gpu-check: setup
	PYTHON=$(BIN)/python bash bench/gpu_check.sh

# Sequential verdicts, then fixed-k at the same seeds, then the two side by side (~20 min).
bench-diagnosis: setup
	$(BIN)/python -m bench.diagnosis --out bench/diagnosis/results
	$(BIN)/python -m bench.diagnosis --max-seeds 1 --out bench/diagnosis/results/fixed_k
	$(BIN)/python -m bench.diagnosis.compare bench/diagnosis/results/fixed_k \
		bench/diagnosis/results --out bench/diagnosis/results

# The scenarios' labels (which cards remove each fault), then the fault families' fix lists,
# measured on seeds the benchmarks never use: about 30 + 15 minutes on 2 idle cores; rerun when
# a plant or a card changes.
bench-truth: setup
	$(BIN)/python -m bench.diagnosis.truth
	$(BIN)/python -m bench.diagnosis.truth --families

bench-verdicts: setup
	$(BIN)/python -m bench.verdicts

# The LR each shape trains best at (families.HEALTHY_LR, ~6 min), then the kept split (~10 min).
bench-split: setup  # tuning and healthy sets; a held-out draw is scored once, by hand (bench/frozen.py)
	$(BIN)/python -m bench.diagnosis.healthy_lr
	$(BIN)/python -m bench.diagnosis.split --set tuning healthy

bench-corpus: setup  # the real-world corpus, tuning half (bench/README.md, "Real-world corpus")
	OMP_NUM_THREADS=1 $(BIN)/python -m bench.corpus --set tuning

bench-apps: setup  # foreign-app benchmark, tuning set (bench/README.md, "Foreign apps")
	OMP_NUM_THREADS=1 $(BIN)/python -m bench.apps --set tuning

bench-faults: setup
	$(BIN)/python -m bench.faults

# Thread sizing on vs off, alone and beside a CPU-hungry job, side by side (~3 min on 2 cores).
bench-threads: setup
	$(BIN)/python -m bench.threads

clean:
	rm -rf $(VENV) .hyprun mlflow.db mlruns
