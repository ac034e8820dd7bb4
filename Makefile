# The two quickstart commands: `make demo` and `make test`. Each creates the
# virtual environment on first use and installs what it needs into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench wheel

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# TORCH_INDEX: a wheel index for torch (https://download.pytorch.org/whl/cpu on a machine without a GPU).
demo: $(BIN)/python
	$(if $(TORCH_INDEX),$(BIN)/pip install -q torch --index-url $(TORCH_INDEX))
	$(BIN)/pip install -q -e '.[demo]'
	$(BIN)/otel-rl demo

# verl is installed without its dependencies: its tensordict pin (<= 0.10) refuses TorchRL 0.14's, and its tracking and
# metrics run on either; the rest of its dependencies are in the test extra.
test: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps 'verl>=0.9.1,<0.10'
	command -v prometheus >/dev/null && command -v chromium-headless-shell >/dev/null && test -x /usr/lib/postgresql/15/bin/initdb \
		&& command -v unshare >/dev/null && command -v cc >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus postgresql-15 chromium-headless-shell util-linux gcc)
	bash collector-config/build.sh
	$(BIN)/lint-imports
	$(BIN)/python -m pytest

bench: $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/python bench/phase_cost.py

# A wheel of otel-rl (its C extensions built for this machine), to install where there is no clone.
wheel: $(BIN)/python
	$(BIN)/pip wheel -q --no-deps -w dist .
	@ls dist/otel_rl-*.whl
