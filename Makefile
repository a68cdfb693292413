# make run       - set up and serve the app on the bundled checkpoint (http://127.0.0.1:7860)
# make test      - set up and run the whole test suite (main venv, browser, then the vLLM CPU venv)
# make test-fast - the edit loop: no training, no servers, no browser, no vLLM (tests/conftest.py TIERS)
# make test-vllm - only the vLLM tests, in their own environment (scripts/setup_vllm_cpu_env.sh)
# make gpu-wheels - download the wheels scripts/gpu_check.sh carries to a GPU machine (docs/gpu_check.md)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
VLLM_PY := .venv-vllm/bin/python

.PHONY: setup app-setup run test test-fast test-main test-vllm vllm-env browser checkpoint gpu-wheels
# setup: the app and the test tools (every test target); app-setup: the app alone (make run), from
# requirements.txt only, so serving from a fresh clone does not wait for pytest, Playwright and SciPy.
setup: $(VENV)/.g4v-stamp
app-setup: $(VENV)/.g4v-app-stamp

$(VENV)/.g4v-stamp: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-dev.txt
	touch $@ $(VENV)/.g4v-app-stamp

$(VENV)/.g4v-app-stamp: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	touch $@

run: app-setup
	$(PY) app.py

browser:
	scripts/setup_browser.sh

# How `make test` shares the cores (docs/tests.md, "How `make test` uses two cores"):
# - the in-process tier (fast, slow and training tests) runs on one pytest-xdist worker more than
#   the cores (WORKERS, at most 4; torch in each on its share of the cores), while Chromium and the
#   vLLM environment are built;
# - the serial tier (app servers, Chromium) runs on two workers, every test module whole on one
#   worker (a third made it faster on a quiet machine, but on a loaded one Chromium fell behind the
#   tests' waits);
# - the vLLM suite runs on two workers, each group of modules sharing an engine
#   (tests/vllm/conftest.py) whole on one worker, each worker's engines on a core of their own.
FAST := not slow and not browser and not server and not training and not vllm
IN_PROCESS := not browser and not server and not vllm
# One worker more than the cores (at most 4), for the in-process tier and make test-fast: a worker
# that waits (on a subprocess, the network) leaves its core to the others instead of idle.
WORKERS := $(shell n=$$(nproc); echo $$(( n + 1 < 4 ? n + 1 : 4 )))
PARALLEL := -n $(WORKERS)
BY_MODULE := -n 2 --dist loadfile
BY_GROUP := -n 2 --dist loadscope --no-loadscope-reorder

test: test-main
	$(VLLM_PY) -m pytest $(BY_GROUP) tests/vllm

test-fast: setup
	$(PY) -m pytest $(PARALLEL) -m "$(FAST)"

# The main suite alone (its Port and Evaluate vLLM tests still need the vLLM environment). The
# builds the in-process tier does not need run beside it; their output goes to .builds.log, shown
# when one fails.
test-main: setup
	@$(MAKE) -j2 browser vllm-env > .builds.log 2>&1 & builds=$$!; \
	echo "building Chromium and the vLLM environment beside the in-process tier (.builds.log)"; \
	$(PY) -m pytest $(PARALLEL) -m "$(IN_PROCESS)"; tests=$$?; \
	if ! wait $$builds; then cat .builds.log; exit 1; fi; \
	exit $$tests
	$(PY) -m pytest $(BY_MODULE) -m "not ($(IN_PROCESS))"

test-vllm: vllm-env
	$(VLLM_PY) -m pytest $(BY_GROUP) tests/vllm

vllm-env:
	PYTHON=$(PYTHON) scripts/setup_vllm_cpu_env.sh

checkpoint: setup
	$(PY) -m g4v.demo build

gpu-wheels:
	scripts/prepare_gpu_wheels.sh
