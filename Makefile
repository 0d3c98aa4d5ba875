# Everyday targets. A fresh clone needs only python3 (>= 3.11: zarr 3 needs it) and make.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch is installed first and pinned: 2.13.0 is the local CPU build here (any other version
# pulls GBs of CUDA wheels); mergekit (and what it needs) only for the parity tests and
# tools/bench_vs_mergekit.py, which find this torch already there; peft (it needs torch too) for the
# LoRA agent tests, which write their adapters with it (tests/test_lora.py; they skip without it).
TORCH := torch==2.13.0
# triton: the torch backend's fused CUDA kernels (backends/torch/fused). torch's CUDA builds ship
# it; the CPU build does not, so it is installed for the tests, pinned to the version they were
# written against: tests/test_fused_kernels.py runs the kernels under its interpreter on the CPU
# and compiles them for sm_90 (it skips without triton). Not a dependency of ramstream.
TRITON := triton==3.6.0
MERGEKIT := mergekit==0.1.5
PEFT := peft==0.21.2

.PHONY: install demo test test-fast test-lowest lint typecheck imports check bench bench-mergekit clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q '$(TORCH)' '$(TRITON)'
	$(BIN)/pip install -q -e '.[test]' '$(MERGEKIT)' '$(PEFT)'
	touch $(STAMP) $(DEMO_STAMP)

# The demo needs ramstream and torch (to score the lab's agents), not the test tools nor mergekit;
# a venv that `make install` made has them already.
DEMO_STAMP := $(VENV)/.installed-demo
$(DEMO_STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q '$(TORCH)'
	$(BIN)/pip install -q -e .
	touch $(DEMO_STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)  ## install ramstream and torch, then merge the built-in RL agents (docs/agents_lab.md) with RAM+
	$(BIN)/ramstream demo

# Numba's on-disk cache notices edits to a kernel's own file only, not to the helpers and constants
# it uses (backends/numba/codecs.py, backends/base.py, ...): the tests use a cache keyed by a digest
# of every backend source, so they never run a stale kernel.
KERNELS_DIGEST := $(shell $(PY) -c "import glob, hashlib; print(hashlib.sha256(b''.join(open(f, 'rb').read() for f in sorted(glob.glob('ramstream/backends/*.py') + glob.glob('ramstream/backends/numba/*.py')))).hexdigest()[:16])")
TEST_ENV := NUMBA_CACHE_DIR=$(CURDIR)/.numba-cache/$(KERNELS_DIGEST)

# pytest-xdist: 4 workers (twice CI's two cores: the tests spend much of their time waiting for
# disk syncs and child processes), a test file per worker at a time (its module fixtures are built
# once), the longest files first (tests/conftest.py). The tests write only under their own
# tmp_path. --compile-first: every method's kernels are compiled into the cache, a process per core,
# before the first test, instead of by each worker and each CLI process the tests start.
WORKERS := -n 4 --dist loadfile --compile-first

# The tests write their checkpoints, indexes and outputs under pytest's base temp: on a tmpfs
# (/dev/shm) where there is one with room, since a sync there costs nothing (every journal mark of a
# merge is synced, and the tests' tiny blocks make thousands of marks: a third of the suite's time on
# a disk), else under /tmp as pytest chooses. Removed afterwards: a tmpfs holds it in memory.
TEST_TMP := $(shell $(PY) -c "import os, shutil; d = '/dev/shm'; ok = os.path.isdir(d) and os.access(d, os.W_OK) and shutil.disk_usage(d).free >= 4 << 30; print(f'{d}/ramstream-tests-{os.getuid()}' if ok else '')")
pytest_in_tmp = $(if $(TEST_TMP),$(1) --basetemp=$(TEST_TMP)-$(2); status=$$?; rm -rf $(TEST_TMP)-$(2); exit $$status,$(1))

test: $(STAMP)  ## install, then run the whole test suite (slow tests too: the mergekit parity)
	$(call pytest_in_tmp,$(TEST_ENV) $(BIN)/python -m pytest -q $(WORKERS) --durations=25,test)

test-fast: $(STAMP)  ## everything but the tests marked slow
	$(call pytest_in_tmp,$(TEST_ENV) $(BIN)/python -m pytest -q $(WORKERS) -m "not slow",fast)

# The floors of pyproject.toml's dependencies are versions that pass: a fresh venv gets exactly
# those (tools/lowest_constraints.py turns each `name>=x` into `name==x`; wheels only), with the
# test extra's tools at their newest (torch and mergekit are left out: their tests skip). It runs
# the tests of what each floor is for, not the whole suite again: every kernel against its slow
# twin and every method once (numpy, numba), the index on every read path (zarr), the CLI (click),
# configs (pyyaml), hub ids (huggingface_hub). Its own numba cache: another numba, other binaries.
LOWEST := .venv-lowest
LOWEST_TESTS := \
	tests/test_kernels.py tests/test_kernels_gta.py tests/test_vector_sums.py tests/test_backends.py \
	tests/test_damaged_index.py tests/test_durability.py tests/test_status.py tests/test_inspect_cli.py \
	tests/test_cli.py tests/test_prewarm.py \
	tests/test_mergekit_config.py tests/test_hostile_configs.py \
	tests/test_hub.py tests/test_hub_cache.py
test-lowest:  ## the floors' own tests against the lowest versions of the direct dependencies (CI runs it)
	rm -rf $(LOWEST)
	$(PY) -m venv $(LOWEST)
	$(LOWEST)/bin/pip install -q --upgrade pip
	$(PY) tools/lowest_constraints.py > $(LOWEST)/constraints.txt
	$(LOWEST)/bin/pip install -q --only-binary=:all: -c $(LOWEST)/constraints.txt -e '.[test]'
	$(call pytest_in_tmp,NUMBA_CACHE_DIR=$(CURDIR)/.numba-cache/lowest-$(KERNELS_DIGEST) $(LOWEST)/bin/python -m pytest -q $(WORKERS) -m "not slow" --durations=25 $(LOWEST_TESTS),lowest)

lint: $(STAMP)
	$(BIN)/ruff check ramstream tests tools
	$(BIN)/ruff format --check ramstream tests tools

typecheck: $(STAMP)
	$(BIN)/mypy ramstream

imports: $(STAMP)  ## the layers and import contracts of pyproject.toml ([tool.importlinter])
	$(BIN)/lint-imports

check: lint typecheck imports test  ## what CI runs

bench: $(STAMP)  ## the spine benchmark on a 0.75B-parameter family (writes ~6 GB under bench-data/)
	$(BIN)/python tools/bench_spine.py --data bench-data

bench-mergekit: $(STAMP)  ## ramstream vs mergekit 0.1.5 on the same family (task_arithmetic, ties, dare_ties, ram)
	$(BIN)/python tools/bench_vs_mergekit.py --data bench-data

clean:
	rm -rf $(VENV) $(LOWEST) build *.egg-info .pytest_cache .pytest-disk .mypy_cache .ruff_cache .hypothesis .numba-cache
