# Two entry points do all the set-up on a fresh machine: `make demo` and `make test`.
# The CPU torch pin is installed FIRST so that the project's unpinned `torch` is already met
# (an unpinned torch from the registry pulls gigabytes of CUDA packages). On a Jetson or a CUDA
# machine, install your own torch build first and set TORCH_PIN= (empty).

PYTHON ?= python3
VENV ?= .venv
TORCH_PIN ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1

.PHONY: setup demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(TORCH_PIN),$(BIN)/python -m pip install -q "$(TORCH_PIN)")
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/python -m simulations demo --out runs/demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Everything, the tests marked slow included (about 2 minutes on 2 cores); plain `pytest` skips those.
test: lint
	$(BIN)/pytest -q -n 2 -m "slow or not slow"

test-fast: lint
	$(BIN)/pytest -q -n 2

bench: setup
	$(BIN)/python bench/loop_overhead.py
	$(BIN)/python bench/relation_vs_target.py --out runs/bench

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
