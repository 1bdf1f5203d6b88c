# The two quickstart commands (README.md):
#   make train   install into .venv (first time only), then train the default model on Multi30k de->en
#   make test    install into .venv (first time only), then lint and run the test suite
# Extra arguments go through ARGS, e.g. make train ARGS="attention=dot trainer.max_epochs=10".
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
# pytest-xdist workers: the suite on both cores of a 2-core machine (tests/conftest.py gives each its share of threads)
TEST_WORKERS ?= 2

# Offline machines: a corpus mirror beside the checkout is used when present (see docs/guides/data.md, "Run offline with a corpus mirror").
SHARED_CORPORA := $(abspath ../shared/corpora)
ifneq ($(wildcard $(SHARED_CORPORA)/multi30k),)
export NMT_DATA_MIRROR ?= $(SHARED_CORPORA)
endif

.PHONY: install train test test-fast lint docs docker-check clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: an unpinned torch would pull gigabytes of CUDA wheels onto a CPU machine.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

train: install
	$(PY) train.py $(ARGS)

lint: install
	$(PY) -m ruff check .

test: lint
	$(PY) -m pytest -n $(TEST_WORKERS) $(ARGS)

# The fast tier (no real-corpus or multi-process runs), e.g. on another Python:
#   make test-fast PYTHON=python3.13 VENV=.venv-3.13
test-fast: install
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not slow" $(ARGS)

# The documentation site (mkdocs.yml), built as CI builds it: a broken link or a page left out fails.
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install --quiet -e ".[docs]"
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict  # (silences Material's notice about MkDocs 2)

# Both images of the Dockerfile built with podman on local Debian bases and run end to end (docs/guides/docker.md):
# root, podman and debootstrap, the network, ~8 GB of disk and half an hour; too heavy for CI (tests/test_docker.py
# lints the Dockerfile there). TORCH_WHEELS=DIR takes torch's CPU wheel from DIR instead of PyTorch's CPU index.
docker-check:
	bash scripts/docker_check.sh

clean:
	rm -rf $(VENV) .venv-3.* outputs multirun .pytest_cache .ruff_cache
