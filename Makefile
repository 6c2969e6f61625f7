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

# Two pytest-xdist workers (a file per worker at a time), then the tests that need the machine to themselves
# (marked serial in tests/conftest.py) in one process; both parts always run, either failing fails the target.
TEST_WORKERS ?= 2
test: install chromium
	@$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial"; a=$$?; \
	$(PY) -m pytest -q -m serial; b=$$?; \
	test $$a -eq 0 && test $$b -eq 0

# Every benchmark, each beside its peer in the same run; each rewrites its docs/BENCHMARKS.md section.
bench: install
	$(PY) bench/bench_traces.py --write-doc
	$(PY) bench/bench_profiler.py --write
	$(PY) bench/bench_fixes.py --compile --write
	$(PY) bench/bench_cold_page.py --write
