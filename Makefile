# make run   - set up and serve the app on the bundled checkpoint (http://127.0.0.1:7860)
# make test  - set up and run the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup run test checkpoint
setup: $(VENV)/.g4v-stamp

$(VENV)/.g4v-stamp: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-dev.txt
	touch $@

run: setup
	$(PY) app.py

test: setup
	$(PY) -m pytest

checkpoint: setup
	$(PY) -m g4v.demo build
