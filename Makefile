# Strop: `make demo` runs the main job on the embedded default; `make test` runs the suite.
SHELL := /bin/bash
# Python 3.11: python3.11 where the machine has it, else a python3 that is 3.11 (as platform/vllm-env.sh picks).
PYTHON ?= $(shell command -v python3.11 || echo python3)
# Where torch's CPU build comes from when pip's own configuration (an index, a wheel directory) has none:
# PyPI's torch is the CUDA build, with gigabytes of CUDA libraries (platform/docker/install-app.sh).
TORCH_CPU_INDEX_URL ?= https://download.pytorch.org/whl/cpu
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
# The dashboard's front-end libraries, fetched with npm into var/vendor (never committed).
HTMX_VERSION := 2.0.11
AXE_VERSION := 4.14.1
ASSETS_STAMP := var/vendor/.htmx-$(HTMX_VERSION)-axe-$(AXE_VERSION)

# When `make` started: `make demo`'s budget counts from here, building the environment included.
MAKE_STARTED := $(shell date +%s)

# The suite runs against the real Postgres and Redis of this machine.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/strop
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15

.PHONY: venv assets browser services test test-hosts demo up starter vllm lint lint-imports typecheck bench-ingest bench-serving bench-capacity bench-trainer bench-freshness bench-experiments bench-dashboard bench-data bench-learning bench-agent-learning bench-specialise vllm-env clean

venv: $(STAMP)

# torch is installed first and pinned to its CPU build (2.13.0+cpu, which requirements.lock's ==2.13.0
# takes), from what pip is configured with, else from PyTorch's CPU index: never PyPI's CUDA one.
$(STAMP): requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --disable-pip-version-check torch==2.13.0+cpu 2>/dev/null \
		|| $(PIP) install --quiet --disable-pip-version-check --index-url $(TORCH_CPU_INDEX_URL) torch==2.13.0+cpu
	$(PIP) install --quiet --disable-pip-version-check -r requirements.lock
	@touch $@

assets: $(ASSETS_STAMP)

$(ASSETS_STAMP):
	@bash platform/vendor-assets.sh $(HTMX_VERSION) $(AXE_VERSION)
	@touch $@

services:
	@bash platform/ensure-services.sh

# Debian's Chromium for the dashboard's browser tests (Playwright drives it).
browser:
	@bash platform/ensure-browser.sh

test: venv assets browser services lint-imports typecheck
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) -m pytest $(PYTEST_ARGS)

# One learning round across separate hosts: network namespaces with no shared filesystem (needs root;
# `make test` runs it too, as part of the suite).
test-hosts: venv services
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) -m pytest tests/hosts -s $(PYTEST_ARGS)

demo: venv assets
	@DEMO_STARTED=$(MAKE_STARTED) bash platform/demo.sh

# Every process (vLLM on SmolLM2, API, workers, beat) in one terminal; it builds .venv and the assets itself,
# saying so (its steps are also in var/log/up.log).
up:
	@bash platform/up.sh

starter: venv
	$(PY) -m model_supply starter --size small

lint: venv lint-imports typecheck
	$(VENV)/bin/ruff check apps config workers benchmarks tests gpu_trainer learning_shared model_supply demo sdk platform

# Types: mypy with the Django and DRF stubs ([tool.mypy] in pyproject.toml). The stubs' plugin
# loads the settings, which need no secrets under DEBUG.
typecheck: venv
	DEBUG=1 $(VENV)/bin/mypy apps config workers gpu_trainer learning_shared model_supply sdk/src demo

# The import contracts in pyproject.toml ([tool.importlinter]).
lint-imports: venv
	$(VENV)/bin/lint-imports

vllm-env:
	@bash platform/vllm-env.sh

# One vLLM server on VLLM_MODEL (default: the small starter model), LoRA on, loopback only.
vllm: venv vllm-env
	bash platform/vllm.sh "$${VLLM_MODEL:-$$($(PY) -m model_supply starter --size small)}"

bench-ingest: venv services
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) benchmarks/ingest.py

bench-serving: venv services
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) benchmarks/serving.py

bench-capacity: venv services
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) benchmarks/capacity.py

bench-experiments: venv services
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) benchmarks/experiments.py

bench-dashboard: venv services
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) benchmarks/dashboard.py $(BENCH_ARGS)

# A year of data (docs/performance.md): BENCH_ARGS="--interactions 10000000" for the issue's full size.
bench-data: venv services
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) benchmarks/data.py $(BENCH_ARGS)

bench-freshness: venv services
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) benchmarks/freshness.py

bench-trainer: venv
	$(PY) benchmarks/trainer.py

# The learning benchmark on SmolLM2-135M-Instruct (CPU, 3 rounds: ~80 min on 2 cores; see docs/performance.md).
LEARNING_ARGS ?= --population line --stop '\n' --train-tasks 512 --eval-tasks 300 --rounds 3 --eval-each-round --set autocast_bf16=auto --threads 2
bench-learning: venv
	$(PY) benchmarks/learning.py $(LEARNING_ARGS)

# Specialisation: two tenants, each its own codebase (Django, NetworkX: pinned in requirements.lock), each
# adapter trained on its training files and judged on unseen files of its own and of the other (SmolLM2;
# ~42 min on 2 cores; on a GPU when there is one, see docs/learning.md "Specialisation").
SPECIALISE_CODEBASES ?= --codebase web=$$($(PY) -c 'import django, os; print(os.path.dirname(django.__file__))') \
	--codebase graphs=$$($(PY) -c 'import networkx, os; print(os.path.dirname(networkx.__file__))')
SPECIALISE_ARGS ?= --population line --stop '\n' --train-tasks 192 --eval-tasks 200 --rounds 2 --threads 2
bench-specialise: venv
	$(PY) benchmarks/specialise.py $(SPECIALISE_CODEBASES) $(SPECIALISE_ARGS)

# Its agent variant: chat answers in the format a simulated user wants (SmolLM2, CPU).
AGENT_LEARNING_ARGS ?= --format codeblock --train 192 --eval 160 --threads 2
bench-agent-learning: venv
	$(PY) benchmarks/agent_learning.py $(AGENT_LEARNING_ARGS)

clean:
	rm -rf $(VENV) var staticfiles
