# Two entry points do all the set-up on a fresh machine: `make run` (the main job) and `make test`.
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
export FLWR_DISABLE_UPDATE_CHECK := 1
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO := 0

# `make run`: Flower's local simulation with its own Flower home and ports, so it neither reuses nor
# leaves behind anybody else's SuperLink; the SuperLink it starts is stopped by process id afterwards.
NODES ?= 4
RUN_CONFIG ?=
SUPERLINK_PORT ?= 39291
FLWR := FLWR_HOME=$(CURDIR)/.flwr FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=$(SUPERLINK_PORT) \
	FLWR_LOCAL_CONTROL_API_PORT=$(shell expr $(SUPERLINK_PORT) + 2) PATH=$(CURDIR)/$(BIN):$$PATH

.PHONY: setup run demo fleet test test-fast test-torch-floor lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(TORCH_PIN),$(BIN)/python -m pip install -q "$(TORCH_PIN)")
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# `flwr run` exits 0 even when the ServerApp fails (Flower 1.41): the run's results line decides, and is
# repeated as the last line (Flower and Ray may log after the ServerApp's own last line).
# `ray-check` before `flwr run`: Ray joins RAY_ADDRESS or the cluster recorded by the last `ray start`, and waits
# forever for a dead one; the check names the cluster, or says what is dead and what to do (exit 2).
run: setup
	@$(BIN)/python -m simulations stop-superlink --port $(SUPERLINK_PORT) >/dev/null
	@$(FLWR) $(BIN)/python -m simulations ray-check
	@mkdir -p runs
	$(FLWR) $(BIN)/flwr run . --stream --federation-config "num-supernodes=$(NODES)" \
		--run-config "results-dir='$(CURDIR)/runs/flwr' $(RUN_CONFIG)" 2>&1 | tee runs/flwr.log; \
	$(BIN)/python -m simulations stop-superlink --port $(SUPERLINK_PORT) >/dev/null; \
	grep '^results: ' runs/flwr.log || { echo "make run: the run ended without its results line" >&2; exit 2; }

demo: setup
	$(BIN)/python -m simulations demo --out runs/demo

# Every method side by side on a fleet file (its own Flower home and ports; stopped by pid afterwards).
FLEET ?= simulations/fleets/quick.yaml
fleet: setup
	$(BIN)/python -m simulations run $(FLEET) --out runs/fleet-$(basename $(notdir $(FLEET)))

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Everything, the tests marked slow included (about 2 minutes on 2 cores); plain `pytest` skips those.
test: lint
	$(BIN)/pytest -q -n 2 -m "slow or not slow"

test-fast: lint
	$(BIN)/pytest -q -n 2

# The oldest torch the code runs on (torch 1.13: the newest that builds for JetPack 4's CUDA 10.2, see
# docs/jetson.md), in a venv of its own: the device layer, the models and the workload counter, the
# training loop, and the ClientApp's rounds (tests/test_models.py checks torch's own flop counter, 2.1+;
# tests/test_torch_floor.py what stands in for it). PyPI's 1.13.1 wheel is the CUDA 11.7 build (~3.5 GB
# installed with the nvidia-*-cu11 packages it imports); it runs on the CPU here. numpy<2: 1.13 needs 1.x.
TORCH_FLOOR ?= torch==1.13.1
FLOOR_VENV ?= .venv-torch113
FLOOR_STAMP := $(FLOOR_VENV)/.installed
FLOOR_TESTS := tests/test_simulated.py tests/test_jetson.py tests/test_fake_board.py \
	tests/test_crash_restore.py tests/test_workload.py tests/test_finetune.py \
	tests/test_finetune_resume.py tests/test_fl_client.py tests/test_torch_floor.py

$(FLOOR_STAMP): pyproject.toml
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install -q --upgrade pip
	$(FLOOR_VENV)/bin/python -m pip install -q "$(TORCH_FLOOR)" "numpy<2"
	$(FLOOR_VENV)/bin/python -m pip install -q -e '.[dev]' "$(TORCH_FLOOR)" "numpy<2"
	touch $(FLOOR_STAMP)

test-torch-floor: $(FLOOR_STAMP)
	$(FLOOR_VENV)/bin/python -c "import torch; v = torch.__version__; assert v.startswith('1.13.'), v; print('torch', v)"
	$(FLOOR_VENV)/bin/pytest -q -n 2 -p no:cacheprovider $(FLOOR_TESTS)

bench: setup
	$(BIN)/python bench/loop_overhead.py
	$(BIN)/python bench/relation_vs_target.py --out runs/bench

clean:
	rm -rf $(VENV) runs .flwr .pytest_cache .ruff_cache
