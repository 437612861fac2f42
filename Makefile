# Every target installs what it needs into .venv first; a fresh clone needs only Python 3.10+ and pip.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Reinstalled when pyproject.toml or the version (packer/about.py) changes: the installed
# metadata carries the version.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml packer/about.py | cksum | cut -d' ' -f1)
# torch is an optional extra; the tests use it (DataLoader workers), so `make test` installs
# the CPU build. 2.13.0 is pinned because this project's machines carry that wheel.
TORCH ?= torch==2.13.0

.PHONY: install install-torch demo test test-plain test-slow lint fmt docs bench bench-components dist smoke clean

install: $(STAMP)

# `packer` was this project's distribution name before packer-image-shards: a .venv made then
# would hold both, the old one's metadata still claiming the package, so it goes first.
$(STAMP): pyproject.toml packer/about.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip uninstall --quiet --yes packer 2>/dev/null || true
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	rm -f $(VENV)/.installed-* && touch $@

install-torch: install
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH)"

# Ends with the point: one epoch read from the folder a file at a time and from each store,
# under a simulated training step, with the share of time a GPU would wait for data.
demo: install
	rm -rf demo
	$(BIN)/python scripts/make_demo_data.py demo/images --csv demo/labels.csv --per-class 250
	$(BIN)/packer pack demo/images demo/demo.lmdb --seed 0
	$(BIN)/packer pack demo/images demo/demo.h5 --labels demo/labels.csv --seed 0
	$(BIN)/packer inspect demo/demo.lmdb
	$(BIN)/packer inspect demo/demo.h5
	$(BIN)/python scripts/demo_compare.py demo/images demo/demo.lmdb demo/demo.h5

# The suite runs in TEST_WORKERS processes (pytest-xdist), each test file whole in one of them
# (its module fixtures built once): most tests wait on child processes, threads or files, so
# two share even two cores. TEST_WORKERS=0 runs it in this process, one test at a time. The
# slow tests run one at a time: each is a scale test that sizes its own memory and threads.
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadfile
test: install install-torch
	$(BIN)/python -m pytest -q $(PARALLEL) --durations=15

# The decode, checksum, pack and read tests again with simplejpeg and ISA-L unimportable, as
# where they have no wheels: packer's Pillow and zlib paths, to the same pixels and checksums.
PLAIN_TESTS := tests/test_reader.py tests/test_pack.py tests/test_imaging.py tests/test_jpeg_turbo.py \
	tests/test_plain_decode.py tests/test_row_checks.py tests/test_verify.py tests/test_augment.py
test-plain: install install-torch
	$(BIN)/python -m pytest -q $(PARALLEL) -p tests.without_accelerators $(PLAIN_TESTS)

test-slow: install install-torch
	$(BIN)/python -m pytest -q -m slow -o addopts=""

lint: install
	$(BIN)/ruff check packer tests scripts benchmarks
	$(BIN)/ruff format --check packer tests scripts benchmarks
	$(BIN)/mypy packer

fmt: install
	$(BIN)/ruff check --fix packer tests scripts benchmarks
	$(BIN)/ruff format packer tests scripts benchmarks

# The documentation site in site/, built strictly: a broken link, anchor or API reference
# fails. The docs extra (MkDocs, Material, mkdocstrings) goes into the same .venv.
docs: install
	$(BIN)/python -c "import mkdocs, material, mkdocstrings" 2>/dev/null || $(BIN)/python -m pip install --quiet -e ".[docs]"
	# No --quiet: it hides the warnings that --strict counts, and a broken link then passes.
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Each script rewrites its results page under docs/benchmarks/ (and its chart: the bench extra).
bench: install install-torch
	$(BIN)/python -c "import matplotlib" 2>/dev/null || $(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/bench_pack.py
	$(BIN)/python benchmarks/bench_reader.py
	$(BIN)/python benchmarks/bench_store_size.py

# The measurements behind the design notes, one after another (each a few minutes at most),
# each rewriting its page under docs/benchmarks/components/.
COMPONENTS := row_checks decode_pool array_export resize lmdb_write hdf5_layout gather_paths dask loader_cpu
bench-components: install install-torch
	for name in $(COMPONENTS); do $(BIN)/python benchmarks/bench_$$name.py || exit 1; done

# The wheel and the sdist in dist/, by the standard front end; their metadata and contents
# checked (twine, scripts/check_dist.py).
dist: install
	rm -rf build dist  # setuptools would package a module left in build/ by an earlier build
	$(BIN)/python -m build --quiet --sdist --wheel --outdir dist .
	$(BIN)/twine check --strict dist/*
	$(BIN)/python scripts/check_dist.py dist

# dist/ installed as users install it: each into a fresh venv outside the checkout, then tried.
smoke: dist
	PYTHON=$(PYTHON) bash scripts/smoke_dist.sh dist

clean:
	rm -rf $(VENV) demo build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache
