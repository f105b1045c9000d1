# Two set-up commands: `make demo` and `make test`. Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# LIBERO itself, without its declared dependencies (its training stack); the simulator's come with .[libero]
LIBERO_NODEPS := libero==0.1.1 bddl==1.0.1
# openpi's client for the tests, without its declared numpy<2 (see pyproject's dev extra)
TEST_NODEPS := openpi-client==0.1.2
export MUJOCO_GL ?= egl

.PHONY: demo test test-slow test-cuda lint install clean
# the whole tree is held to pyflakes; these packages to every rule, the formatter and the type checker
# (pyproject.toml [tool.ruff], [tool.mypy])
CHECKED := src/heisd/decoding src/heisd/retrieval src/heisd/kinematics

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the CPU build on local disk, so no multi-GB CUDA build is pulled
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,libero,robot,ray]'
	$(BIN)/pip install -q --no-deps $(LIBERO_NODEPS) $(TEST_NODEPS)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/heisd demo

lint: $(STAMP)
	$(BIN)/ruff check --select F,E9 src tests
	$(BIN)/ruff check $(CHECKED)
	$(BIN)/ruff format --check $(CHECKED)
	$(BIN)/mypy $(CHECKED)

test: lint
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# on a GPU machine, with an interpreter whose torch sees the GPU (this venv's torch is the CPU build):
#   make test-cuda CUDA_PY=python3     (needs heisd importable there: pip install -e . or PYTHONPATH=src)
CUDA_PY ?= $(BIN)/python
test-cuda:
	$(CUDA_PY) -m pytest -q -m cuda tests/test_cuda.py

clean:
	rm -rf $(VENV) outputs
