# Set-up and checks. `make install` then `make test` is all a new machine needs.
# On the GPU machine there is no .venv: PY falls back to the image's python3.
PY ?= $(shell [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)
PYTEST_FLAGS ?=
# `make test` runs the CPU suite on this many pytest-xdist workers; PYTEST_WORKERS=0 runs it in
# one process. Each worker (and each process a test starts) runs torch on TEST_THREADS threads:
# on two cores, two workers with two OpenMP threads each wait on each other's threads (two
# default `fp4 train` runs side by side took 669 s, against 119 s on one thread each).
PYTEST_WORKERS ?= 2
TEST_THREADS ?= 1
# idle workers take tests queued on busy ones: the suite's slowest tests (minutes each) end
# together instead of one worker finishing alone
PYTEST_DIST ?= $(if $(filter 0,$(PYTEST_WORKERS)),,--dist worksteal)

.PHONY: install test lint gpu-test clean

# pip byte-compiles what it installs: keep it. With `--no-compile` torch installed in 62 s
# instead of 96, but where PYTHONDONTWRITEBYTECODE=1 (as on the test machine) no process then
# writes a .pyc, every one compiles torch from source, and the suite ran far slower.
install:
	python3 -m venv .venv
	.venv/bin/python -m pip install --upgrade pip
	.venv/bin/python -m pip install "torch==2.14.1" "torchvision==0.29.1"
	.venv/bin/python -m pip install -e ".[test]"

test:
	OMP_NUM_THREADS=$(TEST_THREADS) MKL_NUM_THREADS=$(TEST_THREADS) TRITON_INTERPRET=1 \
		$(PY) -m pytest -q -n $(PYTEST_WORKERS) $(PYTEST_DIST) $(PYTEST_FLAGS)

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy fp4cli

gpu-test:
	$(PY) -m pytest -q -m gpu $(PYTEST_FLAGS)

clean:
	rm -rf .venv build *.egg-info .pytest_cache .mypy_cache .ruff_cache
