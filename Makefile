# Everything a newcomer needs: `make demo` and `make test` set up .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export JAVA_HOME ?= /usr/lib/jvm/java-17-openjdk-amd64
export SPARK_LOCAL_IP ?= 127.0.0.1

.PHONY: setup demo test lint bench ui clean

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing Eventide and its dependencies into $(VENV) (about a minute the first time)"
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/eventide demo

test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest tests

lint: setup
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) -m bench.run $(BENCH_ARGS)

ui: setup
	$(VENV)/bin/eventide ui

clean:
	rm -rf .eventide
