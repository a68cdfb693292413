# make run       - set up and serve the app on the bundled checkpoint (http://127.0.0.1:7860)
# make test      - set up and run the whole test suite (main venv, browser, then the vLLM CPU venv)
# make test-fast - the edit loop: no training, no servers, no browser, no vLLM (tests/conftest.py TIERS)
# make test-vllm - only the vLLM tests, in their own environment (scripts/setup_vllm_cpu_env.sh)
# make gpu-wheels - download the wheels scripts/gpu_check.sh carries to a GPU machine (docs/gpu_check.md)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
VLLM_PY := .venv-vllm/bin/python

.PHONY: setup run test test-fast test-main test-vllm vllm-env browser checkpoint gpu-wheels
setup: $(VENV)/.g4v-stamp

$(VENV)/.g4v-stamp: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-dev.txt
	touch $@

run: setup
	$(PY) app.py

browser:
	scripts/setup_browser.sh

# Tests that run in this process (the fast tier, the slow and training tiers) run on every core
# (pytest-xdist, at most 4 workers, each with its share of the cores); the tiers that start servers
# or drive a browser run one test at a time, as their timeouts assume.
FAST := not slow and not browser and not server and not training and not vllm
IN_PROCESS := not browser and not server and not vllm
PARALLEL := -n auto --maxprocesses=4

# The three tiers run one after the other. Running the vLLM suite beside the serial tier saved
# about 5 minutes in CI but made the serial tier's browser waits miss their timeouts there
# (docs/benchmarks.md), so they take turns.
test: test-main
	$(VLLM_PY) -m pytest tests/vllm

test-fast: setup
	$(PY) -m pytest $(PARALLEL) -m "$(FAST)"

# The main suite alone (its Port-tab test still needs the vLLM environment). Its three builds run
# side by side: they mostly wait on downloads, and in a fresh clone they took about 10 minutes in turn.
test-main:
	$(MAKE) -j3 setup browser vllm-env
	$(PY) -m pytest $(PARALLEL) -m "$(IN_PROCESS)"
	$(PY) -m pytest -m "not ($(IN_PROCESS))"

test-vllm: vllm-env
	$(VLLM_PY) -m pytest tests/vllm

vllm-env:
	scripts/setup_vllm_cpu_env.sh

checkpoint: setup
	$(PY) -m g4v.demo build

gpu-wheels:
	scripts/prepare_gpu_wheels.sh
