# Two commands do everything on a fresh Debian 12 machine (as root):
#   make demo   set up, build the op library, train the demo model on MovieLens-100k
#   make test   set up, build, run the C++ core's googletest suite and the Python tests
# Each step is skipped when its result is already there, so a second run is quick.

SHELL := /bin/bash
PYTHON ?= python3
# The TensorFlow to build and test against: `make test` uses 2.15 (the pinned runtime, the last
# TensorFlow with Estimator) in .venv; `make test TF=2.18` uses TensorFlow 2.18 in .venv-tf2.18,
# and so on for every requirements-tf<minor>.txt (2.16 to the newest). The op library is rebuilt
# when TF changes. The versions and their pins: python/rec_sdk/base/release.py.
TF ?= 2.15
TF_VERSIONS := 2.15 $(sort $(patsubst requirements-tf%.txt,%,$(wildcard requirements-tf*.txt)))
ifeq ($(TF),2.15)
VENV := .venv
REQUIREMENTS := requirements.txt
else
VENV := .venv-tf$(TF)
REQUIREMENTS := requirements-tf$(TF).txt
endif
ifeq ($(wildcard $(REQUIREMENTS)),)
$(error TF=$(TF) is not a supported TensorFlow: use TF=2.15 (default) or one of $(patsubst requirements-tf%.txt,TF=%,$(wildcard requirements-tf*.txt)))
endif
PY := $(VENV)/bin/python
BAZEL ?= bazel
VENV_STAMP := $(VENV)/.rec_sdk-installed
OPS_DIR := python/rec_sdk/ops
DEMO_ARGS ?=
APT_PACKAGES := bazel-bootstrap libgtest-dev g++ python3-venv

.PHONY: demo test smoke build configure setup system-deps cc-test py-test wheel wheel-test wheels \
  tf-versions venv-requirements bench stress sanitize clean lint format

demo: build
	$(PY) -m rec_sdk.examples.demo $(DEMO_ARGS)

test: lint cc-test py-test wheel-test

# ruff (checks and formatter; configured in pyproject.toml) over the Python sources and
# clang-format (.clang-format) over tf_ops/, from their own venv with the versions of
# requirements-lint.txt: `make lint` fails on any report, `make format` applies the fixes.
LINT_VENV := .venv-lint
LINT_STAMP := $(LINT_VENV)/.installed
CXX_SOURCES = $(shell find tf_ops -name '*.cc' -o -name '*.h' | sort)
lint: system-deps $(LINT_STAMP)
	$(LINT_VENV)/bin/ruff check .
	$(LINT_VENV)/bin/ruff format --check .
	@echo "$(LINT_VENV)/bin/clang-format --dry-run --Werror <the $(words $(CXX_SOURCES)) files of tf_ops/>"
	@$(LINT_VENV)/bin/clang-format --dry-run --Werror $(CXX_SOURCES)

format: system-deps $(LINT_STAMP)
	$(LINT_VENV)/bin/ruff check --fix .
	$(LINT_VENV)/bin/ruff format .
	$(LINT_VENV)/bin/clang-format -i $(CXX_SOURCES)

$(LINT_STAMP): requirements-lint.txt
	[ -x $(LINT_VENV)/bin/python ] || $(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/pip install -q --disable-pip-version-check -r requirements-lint.txt
	touch $@

cc-test: build
	$(BAZEL) test //tf_ops/...

# pytest exits non-zero when a test fails and also when it collects no tests (code 5). The
# tests are spread over two pytest-xdist workers (TEST_WORKERS=0 runs them in this process):
# each test must pass whatever ran before it in its process.
# TEST_MARKS selects the tests by marker: CI's run on the newest TensorFlow also leaves out
# those marked `once` (tests/conftest.py), which it runs with the pinned TensorFlow.
TEST_WORKERS ?= 2
TEST_MARKS ?= not stress
PYTEST := $(PY) -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist load)
py-test: build
	$(PYTEST) -m "$(TEST_MARKS)" tests

# The short subset of the Python tests that CI runs on the TensorFlows between 2.15 and the
# newest (`make smoke TF=2.18`: the build, these tests and the wheel check): the op library's
# loading and shapes, every optimizer against NumPy, lookups, checkpoints, de training, Keras,
# and the served model's exactness at every version (it relies on stock TensorFlow's
# DenseHashTable and MutexV2 behaving alike on every version).
SMOKE_TESTS := tests/test_loader.py tests/test_op_shapes.py tests/test_optimizers.py \
  tests/test_embedding_api.py tests/test_checkpoint.py tests/test_dynamic_embedding_training.py \
  tests/test_tf_versions.py tests/test_release.py \
  tests/test_serving_exact.py::test_every_version_serves_exactly_the_trained_rows[indexed] \
  tests/test_serving_exact.py::test_a_key_written_after_a_neighbours_removal_then_removed_reads_the_default \
  tests/test_serving_exact.py::test_each_request_reads_one_version_while_updates_apply
smoke: build
	$(PYTEST) $(SMOKE_TESTS)
	$(MAKE) --no-print-directory wheel-test TF=$(TF) WHEEL_CHECK_ARGS=--reuse-packages

# The wheel and sdist for the TensorFlow the op library was built against, into dist/<minor>/:
# rec_sdk_tf2_18-0.1.0-cp39.cp310.cp311.cp312-none-manylinux_2_35_x86_64.whl and
# rec_sdk_tf2_18-0.1.0.tar.gz, one distribution per TensorFlow minor version requiring that
# TensorFlow (setup.py, python/rec_sdk/base/release.py). setuptools builds the wheel;
# scripts/dist.py, with the tools of requirements-release.txt (.venv-release), gives it the
# CPython tags of that TensorFlow and a manylinux tag (auditwheel), builds the sdist and checks
# both (auditwheel show, twine check).
DIST := dist/$(TF)
RELEASE_VENV := .venv-release
RELEASE_STAMP := $(RELEASE_VENV)/.installed
wheel: build $(RELEASE_STAMP)
	# setuptools' build/lib keeps modules since moved or deleted: a wheel is built from scratch.
	rm -rf $(DIST) build/lib build/bdist.* build/wheel-$(TF)
	$(PY) -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
	  -w build/wheel-$(TF) .
	$(RELEASE_VENV)/bin/python scripts/dist.py wheel build/wheel-$(TF)/*.whl $(DIST)
	$(RELEASE_VENV)/bin/python scripts/dist.py sdist $(DIST)

$(RELEASE_STAMP): requirements-release.txt
	[ -x $(RELEASE_VENV)/bin/python ] || $(PYTHON) -m venv $(RELEASE_VENV)
	$(RELEASE_VENV)/bin/pip install -q --disable-pip-version-check -r requirements-release.txt
	touch $@

# The wheel as users install it (tests/wheel_check.py): a package index on 127.0.0.1 serves
# dist/<minor>/, pip installs the wheel from it into a fresh venv (TensorFlow from pip's index)
# and the README example trains from there. `make smoke` passes --reuse-packages: the scratch
# venv sees this venv's packages, so pip checks the wheel's requirements against them instead
# of installing TensorFlow again. WHEEL_PYTHONS="3.10 3.12" (or `all`) also installs it into
# venvs of those CPythons (python3.X on PATH or pyenv's), each with its own TensorFlow. By
# default the oldest TensorFlow's check also installs the sdist (--sdist: pip builds the op
# library with Bazel) and the newest's also installs on Python 3.12.
WHEEL_CHECK_ARGS ?= $(if $(filter $(TF),$(firstword $(TF_VERSIONS))),--sdist)
WHEEL_PYTHONS ?= $(if $(filter $(TF),$(lastword $(TF_VERSIONS))),3.12)
wheel-test: wheel
	$(PY) tests/wheel_check.py $(WHEEL_CHECK_ARGS) $(addprefix --python ,$(WHEEL_PYTHONS)) $(DIST)

# Every supported TensorFlow's wheel, each into dist/<minor>/ (each makes its venv on first use
# and rebuilds the op library, one to two minutes).
wheels:
	set -e; for tf in $(TF_VERSIONS); do $(MAKE) --no-print-directory wheel TF=$$tf; done
	ls dist/*/*.whl dist/*/*.tar.gz

tf-versions:
	@echo $(TF_VERSIONS)

# The venv's packages only (no editable install, no stamp): CI installs the next version's
# while the current one builds and tests; `make setup` finds them there.
venv-requirements:
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r $(REQUIREMENTS)
	# TensorFlow Serving's protos for the tests' TF Serving stand-in and the watcher's gRPC
	# (--no-deps: it requires the `tensorflow` package, and 2.15's venv has tensorflow-cpu).
	$(PY) -m pip install -q --disable-pip-version-check --no-deps "tensorflow-serving-api==$(TF).*"

build: setup
	$(BAZEL) build //tf_ops:_rec_sdk_ops.so //tf_ops:tf_version
	install -m 0644 bazel-bin/tf_ops/_rec_sdk_ops.so $(OPS_DIR)/_rec_sdk_ops.so
	install -m 0644 bazel-bin/tf_ops/_rec_sdk_ops.tf_version $(OPS_DIR)/_rec_sdk_ops.tf_version

setup: system-deps $(VENV_STAMP) .bazelrc

configure: $(VENV_STAMP)
	$(PY) configure.py

# .bazelrc is written for the venv's TensorFlow: again when configure.py or the venv changed,
# or when it was written for another TF='s venv (configure.py leaves an unchanged file as it is).
BAZELRC_FOR_OTHER_VENV := $(if $(shell grep -sF "$(abspath $(VENV))/" .bazelrc),,FORCE)
.bazelrc: configure.py $(VENV_STAMP) $(BAZELRC_FOR_OTHER_VENV)
	$(PY) configure.py
	touch $@

.PHONY: FORCE
FORCE:

# Bazel, googletest, a C++ compiler and venv support from Debian, installed only when missing.
system-deps:
	@missing=0; \
	command -v $(BAZEL) >/dev/null 2>&1 || missing=1; \
	[ -f /usr/include/gtest/gtest.h ] || missing=1; \
	command -v g++ >/dev/null 2>&1 || missing=1; \
	$(PYTHON) -c "import ensurepip, venv" >/dev/null 2>&1 || missing=1; \
	if [ $$missing = 1 ]; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "Missing system packages; run as root: apt-get install -y $(APT_PACKAGES)"; exit 1; \
	  fi; \
	  echo "Installing $(APT_PACKAGES) from Debian"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	fi

# The editable install is the distribution of the venv's TensorFlow (rec-sdk-tf2-15 in .venv);
# a venv made before the per-TensorFlow names has `rec_sdk` installed, which goes first.
$(VENV_STAMP): $(REQUIREMENTS) pyproject.toml setup.py
	$(MAKE) --no-print-directory venv-requirements TF=$(TF)
	$(PY) -m pip uninstall -q -y --disable-pip-version-check rec_sdk
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# Benchmarks (not part of `make test`); installs the TFRA peer and matplotlib (for the
# scaling plot) into the venv, and the TorchRec/FBGEMM peer into its own venv (.venv-peers,
# benchmarks/setup_peers.sh), when possible.
bench: build
	-$(PY) -m pip install -q --disable-pip-version-check --no-deps tensorflow-recommenders-addons==0.7.2
	-$(PY) -m pip install -q --disable-pip-version-check matplotlib==3.8.4 "numpy<2"
	-bash benchmarks/setup_peers.sh
	$(PY) benchmarks/bench_peers.py
	$(PY) benchmarks/bench_table.py
	$(PY) benchmarks/bench_dynamic_embedding.py
	$(PY) benchmarks/bench_distributed.py
	mkdir -p build
	$(PY) benchmarks/bench_ranks.py --ranks 2,3,4 --json build/bench_ranks.json
	$(PY) benchmarks/rank_model.py --measured build/bench_ranks.json
	$(PY) benchmarks/bench_ranks.py --pinned --stages --ranks 2 --json build/bench_ranks_pinned.json
	$(PY) benchmarks/rank_model.py --measured build/bench_ranks_pinned.json
	$(PY) -m rec_sdk.distribute.launch --ps 0 --workers 2 -- $(PY) benchmarks/rank_overlap.py
	$(PY) benchmarks/bench_pipeline.py
	$(PY) benchmarks/bench_checkpoint.py
	$(PY) benchmarks/bench_models.py --scaling --plot benchmarks/scaling.png --precision --precision-keys 8000000
	$(PY) benchmarks/bench_tiered.py
	$(PY) benchmarks/bench_serving.py

# The stress suite (kills during saves, ...) and the tests marked `stress` (long multi-process
# runs: 40 tables over 3 ranks, per-host dedup over 4 ranks, bytes per step): minutes, not
# part of `make test`, which runs the suite's quick subset (tests/test_stress_quick.py) and
# shorter runs of the same code.
stress: build
	$(PYTEST) -m stress tests
	$(PY) tests/stress/run.py

# The core's googletest suite under AddressSanitizer and UndefinedBehaviorSanitizer, built
# with g++ directly (the core has no TensorFlow dependency). Not part of `make test`.
CORE_SRCS := $(wildcard tf_ops/core/*.cc)
CORE_TESTS := $(wildcard tf_ops/core/tests/*_test.cc)
# Run again with every table on a compact index (as tf_ops/BUILD's *_compact_index tests).
COMPACT_INDEX_TESTS := embedding_table_test table_admission_test table_concurrency_test \
  table_snapshot_test
# The tests whose code runs on several threads, once more under ThreadSanitizer.
TSAN_TESTS := parallel_test unique_test row_sum_test hash_index_test table_concurrency_test
SANITIZE_FLAGS_asan := -fsanitize=address,undefined -fno-sanitize-recover=all \
  -fno-omit-frame-pointer
SANITIZE_FLAGS_tsan := -fsanitize=thread
# The core's objects are compiled once per sanitizer (build/sanitize/<kind>/), then each test.
build/sanitize/%.o: $(CORE_SRCS) $(wildcard tf_ops/core/*.h)
	@mkdir -p $(dir $@)
	g++ -std=c++17 -O1 -g $(SANITIZE_FLAGS_$(firstword $(subst /, ,$*))) -I. -c \
	  tf_ops/core/$(notdir $*).cc -o $@
SANITIZE_OBJS_asan := $(patsubst tf_ops/core/%.cc,build/sanitize/asan/%.o,$(CORE_SRCS))
SANITIZE_OBJS_tsan := $(patsubst tf_ops/core/%.cc,build/sanitize/tsan/%.o,$(CORE_SRCS))
build/sanitize/asan/%_test: tf_ops/core/tests/%_test.cc $(SANITIZE_OBJS_asan)
	g++ -std=c++17 -O1 -g $(SANITIZE_FLAGS_asan) -I. $< $(SANITIZE_OBJS_asan) \
	  -lgtest -lgtest_main -pthread -o $@
build/sanitize/tsan/%_test: tf_ops/core/tests/%_test.cc $(SANITIZE_OBJS_tsan)
	g++ -std=c++17 -O1 -g $(SANITIZE_FLAGS_tsan) -I. $< $(SANITIZE_OBJS_tsan) \
	  -lgtest -lgtest_main -pthread -o $@

sanitize: system-deps
	$(MAKE) -j$$(nproc) $(patsubst tf_ops/core/tests/%.cc,build/sanitize/asan/%,$(CORE_TESTS)) \
	  $(patsubst %,build/sanitize/tsan/%,$(TSAN_TESTS))
	set -e; for test in $(CORE_TESTS); do \
	  name=$$(basename $$test .cc); \
	  build/sanitize/asan/$$name --gtest_brief=1; \
	  case " $(COMPACT_INDEX_TESTS) " in *" $$name "*) \
	    REC_SDK_TEST_INDEX_LAYOUT=compact build/sanitize/asan/$$name --gtest_brief=1;; esac; \
	done
	set -e; for name in $(TSAN_TESTS); do \
	  TSAN_OPTIONS=halt_on_error=1 build/sanitize/tsan/$$name --gtest_brief=1; \
	done

clean:
	-$(BAZEL) clean
	rm -rf build dist
	rm -f $(OPS_DIR)/_rec_sdk_ops.so $(OPS_DIR)/_rec_sdk_ops.tf_version .bazelrc
