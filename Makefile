# libcuda_kernels.so: build, test, benchmark, install.
#
#   make                 build libcuda_kernels.so (fat binary for $(ARCHS), PTX for newer GPUs)
#   make test            CPU tests always; GPU tests where a GPU is present (they skip otherwise)
#   make bench           a first look: representative rows of every family beside cuBLAS and
#                        the roofline (ck_bench --sample) -> benchmarks/results/<gpu>-sample.*
#   make bench-full      the whole sweep, every family at every shape -> benchmarks/results/
#   make bench-call-cost the host time of one call: CUDA runtime calls, an empty launch and three
#                        entry points at M=1 (build/bench_call_cost; prints a table)
#   make demo            quantize a weight matrix on the GPU and report the error of each format
#   make sanitize        GPU tests under compute-sanitizer memcheck, racecheck and initcheck
#   make fuzz            the long robustness runs: the ABI fuzzer, the GPU shape sweep, memcheck
#   make install PREFIX=/usr/local   header, library, pkg-config file and CMake package
#   make plots           charts of the committed benchmark results -> benchmarks/results/*.png
#   make clean
#
# Variables: ARCHS (SM versions, default "75 80 86 89 90"), CUDA_HOME, PYTHON, PREFIX,
# SANITIZE_TOOLS, SANITIZE_TESTS and SANITIZE_JOBS (make sanitize), FUZZ_EXAMPLES, FUZZ_SHAPES and
# FUZZ_JOBS (make fuzz), PLOT_RESULTS and PLOT_PYTHON (make plots).
#
# Every core builds at once unless the command line says -j; a make run by another make keeps
# its parent's job server, and `make clean ...` stays serial so that clean ends before the rest.
# (GNU nproc obeys OMP_NUM_THREADS, which a shell for OpenMP programs often sets to 1: not here.)
CORES := $(shell env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)
ifeq ($(MAKELEVEL)$(filter clean,$(MAKECMDGOALS))$(filter -j%,$(MAKEFLAGS)),0)
MAKEFLAGS += -j$(CORES)
endif

CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc))
NVCC      ?= $(CUDA_HOME)/bin/nvcc
PREFIX    ?= /usr/local
ARCHS     ?= 75 80 86 89 90
# PTX of the newest architecture rides along so that newer GPUs can JIT-compile it.
PTX_ARCH  ?= $(lastword $(ARCHS))

BUILD     := build
LIB       := libcuda_kernels.so
VERSION   := $(shell sed -n 's/^\#define CK_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)/\2/p' cuda_kernels.h | paste -sd.)

GENCODE   := $(foreach a,$(ARCHS),-gencode=arch=compute_$(a),code=sm_$(a)) \
             -gencode=arch=compute_$(PTX_ARCH),code=compute_$(PTX_ARCH)
# Hopper's wgmma/TMA kernels need the architecture-specific sm_90a target: files named *_sm90.cu
# build their sm_90 code as sm_90a (it runs on every compute capability 9.0 GPU) and their other
# targets as empty fallbacks; CK_BUILD_SM90A tells the host side that the sm_90a code is there.
comma     := ,
GENCODE_SM90A := $(subst arch=compute_90$(comma)code=sm_90,arch=compute_90a$(comma)code=sm_90a,$(GENCODE))
SM90A_DEF := $(if $(filter 90,$(ARCHS)),-DCK_BUILD_SM90A)
NVCCFLAGS ?= -O3 -std=c++17 -lineinfo --expt-relaxed-constexpr -Xcompiler -fPIC,-fvisibility=hidden,-Wall
# nvcc compiles the architectures of one file in parallel (the largest file bounds the build).
NVCC_THREADS := $(if $(word 2,$(ARCHS)),--threads 0)
NVCC_ALL  := $(NVCCFLAGS) $(NVCC_THREADS) $(GENCODE) -I.
LDFLAGS   := -shared -cudart shared -lcublasLt -lcublas \
             -Xlinker --version-script=$(CURDIR)/cuda_kernels.map -Xlinker -rpath=$(CUDA_HOME)/lib64

# kernels/core/ holds the layers every family shares; kernels/<family>/ one folder per family.
KERNEL_SRCS := $(wildcard kernels/*/*.cu)
OBJS        := $(BUILD)/cuda_kernels.o $(patsubst kernels/%.cu,$(BUILD)/kernels/%.o,$(KERNEL_SRCS))
HEADERS     := cuda_kernels.h $(wildcard kernels/*/*.cuh)

# Use python3 when it already has NumPy, pytest and Hypothesis (the GPU machine has no network);
# otherwise a private virtual environment built from requirements.txt.
PYTHON ?= $(shell python3 -c 'import numpy, pytest, hypothesis' >/dev/null 2>&1 && echo python3 || echo .venv/bin/python)

.PHONY: all test bench bench-full bench-call-cost demo sanitize fuzz fuzz-memcheck install plots clean FORCE
all: $(LIB)

$(BUILD)/cuda_kernels.o: cuda_kernels.cu $(HEADERS) | $(BUILD)/kernels
	$(NVCC) $(NVCC_ALL) -c $< -o $@

$(BUILD)/kernels/%_sm90.o: kernels/%_sm90.cu $(HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(GENCODE_SM90A) $(SM90A_DEF) -I. -c $< -o $@

$(BUILD)/kernels/%.o: kernels/%.cu $(HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_ALL) -c $< -o $@

$(LIB): $(OBJS) cuda_kernels.map
	$(NVCC) $(GENCODE) $(OBJS) $(LDFLAGS) -o $@

$(BUILD)/kernels:
	mkdir -p $@

# A plain C99 program that links the library through the header alone (plus cudart for its
# own buffers). -isystem: CUDA's headers are not ISO C99 (anonymous unions); -pedantic stays on
# for the program and cuda_kernels.h.
$(BUILD)/c_smoke: tests/c/smoke.c cuda_kernels.h $(LIB) | $(BUILD)/kernels
	$(CC) -std=c99 -Wall -Wextra -Werror -pedantic -I. -isystem $(CUDA_HOME)/include $< \
	  -L. -lcuda_kernels -L$(CUDA_HOME)/lib64 -lcudart \
	  -Wl,-rpath,'$$ORIGIN/..' -Wl,-rpath,$(CUDA_HOME)/lib64 -o $@

$(BUILD)/ck_bench: benchmarks/bench.cu benchmarks/*.cuh cuda_kernels.h $(LIB) | $(BUILD)/kernels
	$(NVCC) $(NVCC_ALL) $< -L. -lcuda_kernels -lcublasLt -lcublas -Xlinker -rpath='$$ORIGIN/..' -o $@

# Host-side cost per call (benchmarks/bench_call_cost.cu): links the library like a C++ user.
$(BUILD)/bench_call_cost: benchmarks/bench_call_cost.cu cuda_kernels.h $(LIB) | $(BUILD)/kernels
	$(NVCC) $(NVCC_ALL) $< -L. -lcuda_kernels -Xlinker -rpath='$$ORIGIN/..' -o $@

.venv/bin/python: requirements.txt
	python3 -m venv .venv
	.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

PYDEPS := $(if $(filter .venv/bin/python,$(PYTHON)),.venv/bin/python)

test: $(LIB) $(BUILD)/c_smoke $(PYDEPS)
	$(PYTHON) -m pytest tests -q -rs

bench: $(BUILD)/ck_bench
	$(BUILD)/ck_bench --sample --out benchmarks/results

bench-full: $(BUILD)/ck_bench
	$(BUILD)/ck_bench --out benchmarks/results

bench-call-cost: $(BUILD)/bench_call_cost
	$(BUILD)/bench_call_cost

demo: $(LIB) $(PYDEPS)
	$(PYTHON) benchmarks/demo.py

SANITIZER ?= $(CUDA_HOME)/bin/compute-sanitizer
# Tests marked `cublas` run cuBLASLt's own kernels: racecheck reports shared-memory hazards inside
# them (nvjet_sm90_*) and initcheck cannot see their bulk (TMA) stores, so those two tools check
# the library's kernels only.
# make sanitize: each tool over the GPU tests (SANITIZE_TESTS), split into SANITIZE_JOBS processes
# by CK_TEST_SHARD (the sanitizers are CPU-bound; one GPU serves them all), each logging to
# build/sanitize/<tool>-<i>.log. racecheck and initcheck leave out the cuBLAS tests (cuBLAS's own
# kernels are not ours to check); every tool leaves out the tests that fail a CUDA call on purpose.
SANITIZE_TOOLS ?= memcheck racecheck initcheck
SANITIZE_TESTS ?= tests
SANITIZE_JOBS  ?= $(CORES)
sanitize: $(LIB) $(PYDEPS)
	@mkdir -p $(BUILD)/sanitize
	@for tool in $(SANITIZE_TOOLS); do \
	  markers="gpu and not cuda_api_error"; \
	  if [ $$tool != memcheck ]; then markers="$$markers and not cublas"; fi; \
	  echo "== compute-sanitizer --tool $$tool ($$markers; $(SANITIZE_JOBS) processes)"; \
	  seq 0 $$(($(SANITIZE_JOBS) - 1)) | xargs -P $(SANITIZE_JOBS) -I{} sh -c '\
	    log=$(BUILD)/sanitize/'$$tool'-{}.log; \
	    CK_SANITIZE=1 CK_TEST_SHARD={}/$(SANITIZE_JOBS) $(SANITIZER) --tool '$$tool' \
	      --error-exitcode 1 --target-processes all $(PYTHON) -m pytest $(SANITIZE_TESTS) -q \
	      -m "'"$$markers"'" -p no:cacheprovider > $$log 2>&1; rc=$$?; \
	    if [ $$rc = 0 ] || [ $$rc = 5 ]; then echo "'$$tool' {}: $$(tail -n 1 $$log)"; \
	    else echo "'$$tool' {}: FAILED, see $$log"; exit 1; fi' || exit 1; \
	done

# The long robustness runs (make test runs the same tests with small budgets): the ABI fuzzer
# with Hypothesis' "long" profile, FUZZ_EXAMPLES calls per export, where no device is visible
# (its valid calls would launch on fake addresses); the GPU shape sweep, FUZZ_SHAPES cases per
# kernel family plus the tensors past 2^31 elements; the same sweep under compute-sanitizer
# memcheck (with CK_SANITIZE=1's smaller shapes), where there is a GPU and a sanitizer: one
# process per test function, FUZZ_JOBS at once (memcheck is CPU-bound; one GPU serves them all),
# each logging to build/fuzz-memcheck/<test>.log (`make fuzz-memcheck` runs this part alone). A
# function whose tests are all deselected (the cuda_api_error ones) exits with pytest's 5.
FUZZ_EXAMPLES ?= 5000
FUZZ_SHAPES   ?= 500
FUZZ_JOBS     ?= $(CORES)
FUZZ_TESTS    := $(shell sed -n 's/^def \(test_[a-z0-9_]*\).*/\1/p' tests/test_fuzz_gpu.py)
fuzz: $(LIB) $(PYDEPS)
	CUDA_VISIBLE_DEVICES= CK_FUZZ_PROFILE=long CK_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) \
	  $(PYTHON) -m pytest tests/test_fuzz_abi.py -q -rs -p no:cacheprovider
	CK_FUZZ_SHAPES=$(FUZZ_SHAPES) CK_FUZZ_LARGE=1 \
	  $(PYTHON) -m pytest tests/test_fuzz_gpu.py -q -rs -m "gpu and not cuda_api_error" -p no:cacheprovider
	@if ! $(PYTHON) -c 'import sys, cuda_wrapper as ck; sys.exit(ck.device_count() == 0)' 2>/dev/null; then \
	  echo "== no CUDA device: the memcheck run is skipped"; \
	elif [ ! -x $(SANITIZER) ]; then \
	  echo "== $(SANITIZER) not found: cannot run the memcheck run"; exit 1; \
	else \
	  $(MAKE) --no-print-directory fuzz-memcheck; \
	fi

fuzz-memcheck: $(LIB) $(PYDEPS)
	@mkdir -p $(BUILD)/fuzz-memcheck
	@echo "== compute-sanitizer --tool memcheck (tests/test_fuzz_gpu.py, $(FUZZ_SHAPES) shapes, $(FUZZ_JOBS) at once)"
	@printf '%s\n' $(FUZZ_TESTS) | xargs -P $(FUZZ_JOBS) -I{} sh -c '\
	  log=$(BUILD)/fuzz-memcheck/{}.log; \
	  CK_SANITIZE=1 CK_FUZZ_SHAPES=$(FUZZ_SHAPES) $(SANITIZER) --tool memcheck --error-exitcode 1 \
	    --target-processes all $(PYTHON) -m pytest "tests/test_fuzz_gpu.py::{}" -q \
	    -m "gpu and not cuda_api_error" -p no:cacheprovider > $$log 2>&1; rc=$$?; \
	  if [ $$rc = 0 ] || [ $$rc = 5 ]; then echo "{}: $$(tail -n 1 $$log)"; \
	  else echo "{}: FAILED, see $$log"; exit 1; fi'

# Regenerated on every install, so that it always carries this PREFIX.
cuda_kernels.pc: cuda_kernels.pc.in cuda_kernels.h FORCE
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' -e 's|@CUDA_HOME@|$(CUDA_HOME)|g' $< > $@

# The CMake package (find_package(cuda_kernels) -> cuda_kernels::cuda_kernels) finds the prefix
# from its own place, so only its version file is written for this install.
CMAKE_PKG_DIR := $(DESTDIR)$(PREFIX)/lib/cmake/cuda_kernels

install: $(LIB) cuda_kernels.pc cmake/cuda_kernels-config.cmake cmake/cuda_kernels-config-version.cmake.in
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(CMAKE_PKG_DIR)
	install -m 644 cuda_kernels.h $(DESTDIR)$(PREFIX)/include/
	install -m 755 $(LIB) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 cuda_kernels.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/
	install -m 644 cmake/cuda_kernels-config.cmake $(CMAKE_PKG_DIR)/
	sed 's|@VERSION@|$(VERSION)|g' cmake/cuda_kernels-config-version.cmake.in \
	  > $(CMAKE_PKG_DIR)/cuda_kernels-config-version.cmake

# Charts of the committed results for the README (benchmarks/plot.py says what each shows).
# matplotlib lives in its own environment under build/ so that make test never needs it;
# PLOT_PYTHON=python3 uses an interpreter that already has it.
PLOT_RESULTS ?= benchmarks/results/nvidia-h100-80gb-hbm3.json benchmarks/results/moe-nvidia-h100-80gb-hbm3-2026-11-26.json
PLOT_VENV    := $(BUILD)/venv-plots
PLOT_PYTHON  ?= $(PLOT_VENV)/bin/python

$(PLOT_VENV)/bin/python: benchmarks/requirements-plots.txt
	python3 -m venv $(PLOT_VENV)
	$@ -m pip install --quiet --disable-pip-version-check -r $<
	touch $@

plots: $(filter $(PLOT_VENV)/bin/python,$(PLOT_PYTHON))
	$(PLOT_PYTHON) benchmarks/plot.py --out benchmarks/results $(PLOT_RESULTS)

clean:
	rm -rf $(BUILD) $(LIB) cuda_kernels.pc .pytest_cache
