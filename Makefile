# Set-up and the two main jobs. `make test` and `make sweep` create .venv when it is missing
# and install the project into it; re-installing is skipped while pyproject.toml is unchanged.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.harness-installed-$(shell $(PYTHON) -c "import hashlib,sys;print(hashlib.sha256(open('pyproject.toml','rb').read()).hexdigest()[:12])")
PYTEST_ARGS ?= -m "not slow and not gpu" -q

.PHONY: setup test test-all sweep clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c "import sys; assert sys.version_info >= (3, 11), 'Python >= 3.11 is needed, found ' + sys.version.split()[0]"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# No NVIDIA GPU: take the CPU wheel of torch (an unpinned torch pulls a multi-GB CUDA build).
	@if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q "torch==2.13.0"; fi
	$(PY) -m pip install -q -e '.[dist]'  # ray: the Ray-backend tests run against a real local cluster
	@rm -f $(VENV)/.harness-installed-*
	@touch $@

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-all: setup
	$(PY) -m pytest -q

sweep: setup
	$(VENV)/bin/harness sweep sweeps/clipping.yaml --workers 2

clean-venv:
	rm -rf $(VENV)
