# Two entry points do all the set-up on a fresh machine: `make run` (the main job) and `make test`.
# The CPU torch pin is installed FIRST so that the project's unpinned `torch` is already met
# (an unpinned torch from the registry pulls gigabytes of CUDA packages). On a Jetson or a CUDA
# machine, install your own torch build first and set TORCH_PIN= (empty).
# pip installs the torch pin (it reads the machine's pip configuration, which may say where a local CPU
# wheel lies); uv, faster, installs the project and the rest; then the bytecode is compiled once on every
# core (pip compiles on one as it installs). mypy starts once the packages are in, beside the compiling.
# UV_PIN is flwr's own pin on uv. Measured: docs/testing.md.

PYTHON ?= python3
VENV ?= .venv
TORCH_PIN ?= torch==2.13.0
UV_PIN ?= uv>=0.13.5,<0.14
BIN := $(VENV)/bin
DEPS := $(VENV)/.packages
STAMP := $(VENV)/.installed
UV_INSTALL = uv pip install -q --python
# every .pyc a process would otherwise compile on each import (PYTHONDONTWRITEBYTECODE keeps it from
# writing them), on every core; those already written are skipped. Its status is not read: packages ship
# files for newer Pythons (torch's testing/_internal/py312_intrinsics.py), which pip skips the same way.
COMPILE = -m compileall -q -j 0 "$$($(1)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null 2>&1 || true

export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1
export FLWR_DISABLE_UPDATE_CHECK := 1
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO := 0

# `make run`: Flower's local simulation of the app's default federation, with a private Flower home, on
# SUPERLINK_PORT (the control API on +2). `python -m simulations flwr-run` checks NODES and RUN_CONFIG
# before anything starts and owns the run: Ctrl-C or SIGTERM stops the SuperLink, the simulation and Ray
# by process id. RUN_CONFIG is Flower's --run-config syntax, passed through the environment untouched
# (quotes included): make run RUN_CONFIG='num-server-rounds=3 model="cnn-tiny"'.
NODES ?= 4
RUN_CONFIG ?=
SUPERLINK_PORT ?= 39291
RUN_OUT ?= runs/flwr
export RUN_CONFIG

.PHONY: setup run shipped demo fleet test coverage test-fast floor-venvs test-torch-floor test-flower-floor lint typecheck docs bench clean

$(DEPS): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip "$(UV_PIN)"
	$(if $(TORCH_PIN),$(BIN)/python -m pip install -q --no-compile "$(TORCH_PIN)")
	$(BIN)/$(UV_INSTALL) $(BIN)/python -e '.[dev]'
	touch $(DEPS)

$(STAMP): $(DEPS)
	$(BIN)/python $(call COMPILE,$(VENV))
	touch $(STAMP)

setup: $(STAMP)

# `exec`: make's SIGTERM reaches the launcher itself, not a shell. Exit 0 only with the run's results line
# (repeated last); a failed run (every client failed, a ServerApp error) is one line and exit 2.
run: setup
	@exec $(BIN)/python -m simulations flwr-run --nodes "$(NODES)" --port "$(SUPERLINK_PORT)" \
		--out "$(RUN_OUT)" --log "$(dir $(RUN_OUT))flwr.log" --run-config "$$RUN_CONFIG"

# The default run's pre-trained weights and relation vector, shipped in fl_server/shipped/ so that `make run`
# starts at its first round (fl_server/shipped.py): remade from the code, on a CPU, after a change to them.
shipped: setup
	$(BIN)/python -m fl_server.shipped --write

demo: setup
	$(BIN)/python -m simulations demo --out runs/demo

# Every method side by side on a fleet file (its own Flower home and ports; stopped by pid afterwards).
FLEET ?= simulations/fleets/default.yaml
fleet: setup
	$(BIN)/python -m simulations run $(FLEET)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy on the packages users import, on simulations and on bench ([tool.mypy] in pyproject.toml: every
# function annotated, no bare generics, names imported from where they are defined). Most of a cold run
# reads torch's, flwr's, ray's, numpy's and matplotlib's own hints; .mypy_cache keeps them (docs/testing.md).
# Not part of `make test`: .ci/run runs it while the floors' venvs install.
typecheck: $(DEPS)
	$(BIN)/mypy

# The docs' generated parts from the code that defines them: usage blocks (docs/reference/cli.md), the
# settings tables (run-config.md, fleet-file.md) and pyproject.toml's [tool.flwr.app.config]; the hand
# prose around them stays. tests/test_docs.py fails while one is stale.
docs: setup
	$(BIN)/python docs/generate.py

# Everything, the tests marked slow included; plain `pytest` skips those. It names the 25 slowest tests;
# every test's seconds go to $(TEST_REPORT) (JUnit XML), from which `python tests/durations.py` prints
# the table of docs/testing.md. Coverage is `make coverage`'s: its tracer nearly doubles the time of the
# tests that run the library in pytest's own process (docs/testing.md), so the proof that it works
# does not wait for it. Its time and the CI's, commit by commit: docs/testing.md.
TEST_REPORT ?= runs/tests.xml
# Two workers, each test file one unit of work, handed out in collection order (the files with slow tests
# first: tests/conftest.py): a file's module fixtures (a killed profile, two SuperLinks, the demo) are
# built once, not once per worker. (`--dist loadgroup` would group only the files that need it, but with
# pytest 9.2 it silently groups nothing: pytest-xdist issue #1386.)
XDIST := -n 2 --dist loadfile --no-loadscope-reorder
PYTEST_ALL = $(BIN)/pytest -q $(XDIST) -m "slow or not slow" --durations=25 \
	--junitxml=$(TEST_REPORT)
test: lint
	$(PYTEST_ALL)

# The same run measuring line and branch coverage of the non-test code (in the test processes): each
# file below 100 %, then the total.
coverage: lint
	$(PYTEST_ALL) --cov --cov-report=
	$(BIN)/coverage report --skip-covered --sort=cover
	@echo "coverage of the non-test code, lines and branches: $$($(BIN)/coverage report --format=total) %"

test-fast: lint
	$(BIN)/pytest -q $(XDIST)

# The oldest torch the code runs on (torch 1.13: the newest that builds for JetPack 4's CUDA 10.2, see
# docs/jetson.md), in a venv of its own: the device layer, the models and the workload counter, the
# training loop, and the ClientApp's rounds (tests/test_models.py checks torch's own flop counter, 2.1+;
# tests/test_torch_floor.py what stands in for it). PyPI's 1.13.1 wheel is the CUDA 11.7 build (~3.5 GB
# installed with the nvidia-*-cu11 packages it imports); it runs on the CPU here. numpy<2: 1.13 needs 1.x.
# The venv runs on the oldest Python the project declares (requires-python = ">=3.11": Flower 1.41-1.42
# declare it): FLOOR_PYTHON, by default python3.11 on the PATH or pyenv's newest 3.11.x (pyenv's shim
# refuses while another version is its global one); without one, python3 with one line saying so.
# test-torch-floor checks that its interpreter is that floor.
TORCH_FLOOR ?= torch==1.13.1
FLOOR_VENV ?= .venv-torch113
FLOOR_PYTHON ?= $(shell python3.11 -c 'import sys; print(sys.executable)' 2>/dev/null || \
	PYENV_VERSION="$$(pyenv versions --bare 2>/dev/null | grep '^3\.11\.' | tail -n 1)" \
	python3.11 -c 'import sys; print(sys.executable)' 2>/dev/null)
FLOOR_STAMP := $(FLOOR_VENV)/.installed
FLOOR_TESTS := tests/test_simulated.py tests/test_jetson.py tests/test_fake_board.py \
	tests/test_crash_restore.py tests/test_workload.py tests/test_finetune.py \
	tests/test_finetune_resume.py tests/test_fl_client.py tests/test_torch_floor.py tests/test_python_floor.py

# Torch first (the long part: it may install beside the main venv, `make -j 2`), the project after the
# main venv's own editable install (two at once would write the same build metadata in the project).
$(FLOOR_VENV)/.torch: pyproject.toml
	$(if $(FLOOR_PYTHON),$(FLOOR_PYTHON),@echo "no python3.11 found (set FLOOR_PYTHON=PATH): the torch floor's venv uses $(PYTHON), which test-torch-floor refuses unless it is 3.11" >&2; $(PYTHON)) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install -q --upgrade pip "$(UV_PIN)"
	$(FLOOR_VENV)/bin/$(UV_INSTALL) $(FLOOR_VENV)/bin/python "$(TORCH_FLOOR)" "numpy<2"
	touch $(FLOOR_VENV)/.torch

$(FLOOR_STAMP): $(FLOOR_VENV)/.torch $(DEPS)
	$(FLOOR_VENV)/bin/$(UV_INSTALL) $(FLOOR_VENV)/bin/python -e '.[dev]' "$(TORCH_FLOOR)" "numpy<2"
	$(FLOOR_VENV)/bin/python $(call COMPILE,$(FLOOR_VENV))
	touch $(FLOOR_STAMP)

test-torch-floor: $(FLOOR_STAMP)
	$(FLOOR_VENV)/bin/python -c "import sys, tomllib, torch; v = torch.__version__; assert v.startswith('1.13.'), v; \
		floor = tomllib.load(open('pyproject.toml', 'rb'))['project']['requires-python'].lstrip('>='); \
		py = '%d.%d' % sys.version_info[:2]; py == floor or sys.exit(f'$(FLOOR_VENV) runs Python {py}, the declared floor is {floor}: make it with FLOOR_PYTHON=python{floor}'); \
		print('torch', v, 'on Python', py)"
	$(FLOOR_VENV)/bin/pytest -q $(XDIST) -p no:cacheprovider --durations=10 $(FLOOR_TESTS)

# The oldest Flower the pin allows (1.41; `make setup` installs the newest, 1.42): the Flower-facing tests
# (the app, deployment, restarts, fleets; the fast ones: the slow ones run on the newest only) in a
# venv holding only flwr 1.41 and the uv it wants, every other package the main venv's (a .pth adds its
# site-packages after the venv's own).
FLOWER_FLOOR ?= flwr==1.41.*
FLOWER_FLOOR_VENV ?= .venv-flwr141
FLOWER_FLOOR_STAMP := $(FLOWER_FLOOR_VENV)/.installed
FLOWER_TESTS := tests/test_flwr_run.py tests/test_restarts.py tests/test_fleet_run.py \
	tests/test_fl_server.py tests/test_fl_strategy.py tests/test_strategy_wrapper.py tests/test_launcher.py \
	tests/test_linkstate_index.py tests/test_fleet_sampling.py tests/test_supernode_faults.py \
	tests/test_flower_deploy.py tests/test_connection_check.py tests/test_fl_client.py tests/test_process_safety.py

$(FLOWER_FLOOR_STAMP): $(DEPS)
	$(PYTHON) -m venv $(FLOWER_FLOOR_VENV)
	$(FLOWER_FLOOR_VENV)/bin/python -m pip install -q --no-deps "$(FLOWER_FLOOR)" "uv>=0.12.20,<0.13"
	main=$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_path('purelib'))"); \
	floor=$$($(FLOWER_FLOOR_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))"); \
	echo "import site; site.addsitedir('$$main')" > "$$floor/zz-main-venv.pth"
	touch $(FLOWER_FLOOR_STAMP)

# Both floors' venvs: .ci/run builds them beside the main one (`make -j 2 setup floor-venvs`).
floor-venvs: $(FLOOR_STAMP) $(FLOWER_FLOOR_STAMP)

test-flower-floor: $(FLOWER_FLOOR_STAMP)
	$(FLOWER_FLOOR_VENV)/bin/python -c "import flwr; v = flwr.__version__; assert v.startswith('1.41.') and '$(FLOWER_FLOOR_VENV)' in flwr.__file__, (v, flwr.__file__); print('flwr', v, flwr.__file__)"
	$(FLOWER_FLOOR_VENV)/bin/python -m pytest -q $(XDIST) -p no:cacheprovider --durations=10 $(FLOWER_TESTS)

bench: setup
	$(BIN)/python bench/loop_overhead.py
	$(BIN)/python bench/relation_vs_target.py --out runs/bench

clean:
	rm -rf $(VENV) runs .flwr .pytest_cache .ruff_cache .mypy_cache .coverage .coverage.*
