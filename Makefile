# TorchScope. `make run` starts the dashboard; `make test` runs every test.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PORT ?= 8501
# Where the dashboard listens: this machine only. Another address (0.0.0.0) needs TORCHSCOPE_TOKEN, or it
# starts in server-safe mode (README: "Serving others").
ADDRESS ?= 127.0.0.1

.PHONY: run test install chromium bench clean-data

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $(STAMP)

install: $(STAMP)

# `streamlit run app.py`, warm: the spare worker and the pages' imports start with the server (ui/launch.py).
run: install
	$(PY) -m ui.launch --server.address $(ADDRESS) --server.port $(PORT) --server.headless true --browser.gatherUsageStats false

# Debian's chromium for the browser test (never `playwright install`: no downloads here).
chromium:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; fi; } \
	  || echo "warning: could not install chromium; the browser test will fail in CI"

test: install chromium
	$(PY) -m pytest -q

# Every benchmark, each beside its peer in the same run; each rewrites its docs/BENCHMARKS.md section.
bench: install
	$(PY) bench/bench_traces.py --write-doc
	$(PY) bench/bench_profiler.py --write
	$(PY) bench/bench_fixes.py --compile --write
	$(PY) bench/bench_cold_page.py --write
