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

# The serial tier waits on servers and a browser and leaves about 40 % of the two cores idle, so
# the vLLM suite runs beside it: niced (the serial tier's timeouts come first), in a process group
# of its own (stopped whole if the serial tier is interrupted), with its own cache; its output,
# kept in test-output/vllm-suite.log, is printed once it ends. Either failing fails the target.
VLLM_LOG := test-output/vllm-suite.log

test: setup browser vllm-env
	$(PY) -m pytest $(PARALLEL) -m "$(IN_PROCESS)"
	@mkdir -p test-output; \
	setsid nice -n 10 $(VLLM_PY) -m pytest -p no:cacheprovider tests/vllm > $(VLLM_LOG) 2>&1 & beside=$$!; \
	trap 'kill -- -$$beside 2>/dev/null' INT TERM; \
	echo "the vLLM suite runs beside the serial tier: $(VLLM_LOG)"; \
	$(PY) -m pytest -m "not ($(IN_PROCESS))"; serial=$$?; \
	wait $$beside; vllm=$$?; \
	echo "== the vLLM suite, run beside the serial tier =="; cat $(VLLM_LOG); \
	echo "serial tier: exit $$serial; vLLM suite: exit $$vllm"; \
	[ $$serial -eq 0 ] && [ $$vllm -eq 0 ]

test-fast: setup
	$(PY) -m pytest $(PARALLEL) -m "$(FAST)"

# The main suite alone (its Port-tab test still needs the vLLM environment).
test-main: setup browser vllm-env
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
