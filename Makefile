# Set-up and the two main jobs. `make test` and `make sweep` create .venv when it is missing
# and install the project into it; re-installing is skipped while pyproject.toml is unchanged.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.harness-installed-$(shell $(PYTHON) -c "import hashlib,sys;print(hashlib.sha256(open('pyproject.toml','rb').read()).hexdigest()[:12])")
PYTEST_ARGS ?= -m "not slow and not gpu" -q

.PHONY: setup system-packages lint test test-all sweep docs results-doc clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c "import sys; assert sys.version_info >= (3, 11), 'Python >= 3.11 is needed, found ' + sys.version.split()[0]"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# No NVIDIA GPU: take the CPU wheel of torch (an unpinned torch pulls a multi-GB CUDA build).
	@if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q "torch==2.13.0"; fi
	$(PY) -m pip install -q -e '.[dist,dev]'  # ray: the Ray-backend tests run against a real local cluster; ruff
	@rm -f $(VENV)/.harness-installed-*
	@touch $@

# bubblewrap and libseccomp's bindings for the code sandbox (installed when missing, as root)
system-packages:
	@.ci/system-packages

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint system-packages
	$(PY) -m pytest $(PYTEST_ARGS)

test-all: lint system-packages
	$(PY) -m pytest -q

docs: setup
	$(VENV)/bin/harness axes --write-doc docs/algorithms.md

# The clipping sweep under sequential seeds (looks at 3, 5, ..., 15 seeds), capped at SWEEP_MINUTES: after
# the cap no new point or look starts (points in flight finish); `make sweep` again resumes. Then its table.
SWEEP_MINUTES ?= 40
sweep: setup
	$(VENV)/bin/harness sweep sweeps/clipping_sequential.yaml --workers 2 --max-minutes $(SWEEP_MINUTES)
	$(VENV)/bin/harness table results/clipping_sequential

# docs/results.md from results/ (tables, figures under docs/figures/, notes from docs/results_notes/)
results-doc: setup
	$(VENV)/bin/harness results-doc results --out docs/results.md

clean-venv:
	rm -rf $(VENV)
