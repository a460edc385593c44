# twinbench: `make demo` runs the main job, `make test` runs the tests; both set everything up first.
SHELL := /bin/bash
PY := .venv/bin/python
export TF_USE_LEGACY_KERAS := 1
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

.PHONY: setup demo test lint doctor clean

setup:  ## idempotent: Debian OpenMPI, .venv, TensorFlow, tf-keras, Horovod (wheel cached in ~/.cache/twinbench)
	bash scripts/setup.sh

demo: setup  ## local CPU comparison of both backends at 1 and 2 workers on jobs/smoke.toml, then the report
	bash scripts/demo.sh

test:  ## set-up (with Debian's Slurm and munge for tests/test_slurm.py), then the whole test suite
	TWINBENCH_WITH_SLURM=1 bash scripts/setup.sh
	$(PY) -m ruff check .
	$(PY) -m pytest -ra tests

lint:
	$(PY) -m ruff check .

doctor: setup
	$(PY) -m common.doctor

clean:
	rm -rf results demo-results .pytest_cache
