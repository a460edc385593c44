# twinbench: `make demo` runs the main job, `make test` runs the tests; both set everything up first.
# TensorFlow 2.21 by default (requirements.txt); `make test-fallback` sets up and tests the TF 2.18 fallback.
SHELL := /bin/bash
PY := .venv/bin/python
export TF_USE_LEGACY_KERAS := 1
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
# make test: the Slurm and emulated clusters must start (a cluster that cannot start fails the test, never skips it)
TEST_ENV := TWINBENCH_REQUIRE_CLUSTERS=1
DURATIONS ?= 15  # how many of the slowest tests pytest lists (0: every test, for a per-file sum)
# The fallback: TensorFlow 2.18.1 + tf-keras 2.18.0 + the unpatched Horovod sdist (requirements-tf2.18.txt).
FALLBACK_VENV := .venv-tf2.18
FALLBACK_PY := $(FALLBACK_VENV)/bin/python
# What the fallback must keep proving, with the fewest TensorFlow runs (the parity tests share their runs): both
# backends compute the same losses, 1 worker at 2b equals 2 at b, fit equals the custom loop, and Horovod runs
# under mpirun as under Gloo.
FALLBACK_TESTS := tests/test_parity.py::test_native_vs_horovod_two_workers \
	tests/test_parity.py::test_two_workers_equal_one_worker_double_batch \
	tests/test_parity.py::test_fit_and_ctl_compute_the_same_thing \
	tests/test_backends.py::test_horovod_under_mpirun_matches_gloo

# A Horovod built without Gloo (MPI controller only, conda-forge's flags) over .venv's TensorFlow: twinbench's own
# launches (demo, common.check) must run there too, with the Gloo build's losses (tests/test_gloo_less.py).
NOGLOO_VENV := .venv-nogloo

# A stand-in for the last NGC TensorFlow image's stack (nvcr.io/nvidia/tensorflow:25.02-tf2-py3): TensorFlow 2.17.1 +
# tf-keras 2.17.0 + Keras 3.3.2 + the unpatched Horovod sdist (requirements-tf2.17.txt), set up once, then used as
# a stack twinbench did not install (TWINBENCH_STACK=as-is: the doctor must pass) for both backends at 2 ranks.
NGC_VENV := .venv-tf2.17
NGC_PY := $(NGC_VENV)/bin/python
NGC_TESTS := tests/test_parity.py::test_native_vs_horovod_two_workers \
	tests/test_keras3.py::test_keras3_native_vs_horovod_two_workers

.PHONY: setup demo test test-fallback test-nogloo test-ngc lint doctor gpu-check clean

setup:  ## idempotent: Debian OpenMPI, .venv, TensorFlow, tf-keras, Horovod (wheel cached in ~/.cache/twinbench)
	TWINBENCH_VENV=.venv bash scripts/setup.sh

demo: setup  ## local CPU comparison of both backends at 1 and 2 workers on jobs/demo.toml, then the report
	bash scripts/demo.sh

# The suite on two workers: the files that start a Slurm or an emulated cluster on one, the others on the other
# (their session fixtures made once each: tests/conftest.py); then the tests that assert on wall-clock figures, alone.
# One emulated cluster serves both sessions (tests/cluster/emulated.py): started first, stopped by its recorded PIDs
# however the recipe ends.
test:  ## set-up (with Debian's Slurm and munge for tests/test_slurm.py), then the whole test suite
	TWINBENCH_WITH_SLURM=1 TWINBENCH_VENV=.venv bash scripts/setup.sh
	$(PY) -m ruff check .
	emu=$$(mktemp -d /tmp/twinbench-emu.XXXXXX); \
	trap '$(PY) -m tests.cluster.emulated stop "'"$$emu"'"' EXIT; trap 'exit 130' INT TERM; \
	$(PY) -m tests.cluster.emulated start "$$emu" && export TWINBENCH_EMULATED_CLUSTER="$$emu" && \
	$(TEST_ENV) $(PY) -m pytest -ra --durations=$(DURATIONS) -n 2 --dist loadgroup -m "not timing" tests && \
	$(TEST_ENV) $(PY) -m pytest -ra --durations=10 -m timing tests

test-fallback:  ## the TF 2.18 fallback in .venv-tf2.18: set-up, then the parity and Horovod smoke tests
	TWINBENCH_TF=2.18 TWINBENCH_VENV=$(FALLBACK_VENV) bash scripts/setup.sh
	$(FALLBACK_PY) -m pytest -ra $(FALLBACK_TESTS)

test-nogloo: setup  ## .venv-nogloo (Horovod without Gloo, wheel cached): the demo and common.check run on it
	bash scripts/setup_nogloo.sh
	TWINBENCH_GLOO_LESS=1 $(NOGLOO_VENV)/bin/python -m pytest -ra tests/test_gloo_less.py

test-ngc:  ## NGC 25.02's stack stand-in in .venv-tf2.17: set-up, the as-is doctor, then native vs Horovod parity
	TWINBENCH_TF=2.17 TWINBENCH_VENV=$(NGC_VENV) bash scripts/setup.sh
	TWINBENCH_STACK=as-is PYTHON=$(NGC_PY) TWINBENCH_STACK_DEPS=$(NGC_VENV)/stack-deps bash scripts/setup.sh
	PYTHONPATH=$(CURDIR):$(CURDIR)/$(NGC_VENV)/stack-deps $(NGC_PY) -m pytest -ra $(NGC_TESTS)

lint:
	$(PY) -m ruff check .

doctor: setup
	$(PY) -m common.doctor

# On a GPU node, first: the doctor, both backends at 2 ranks on 2 GPUs (NCCL, one GPU per rank, parity), the
# breakdown's device timing; exit 3 without a GPU. Not run on a GPU here (scripts/gpu_check.py).
gpu-check:  ## GPU_RESULTS=DIR (default gpu-check-results, must be new or empty)
	$(PY) scripts/gpu_check.py --results $(or $(GPU_RESULTS),gpu-check-results)

clean:
	rm -rf results demo-results gpu-check-results .pytest_cache
