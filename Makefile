# Both targets bootstrap .venv from pyproject.toml when it is missing or older.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck bench evaluation clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/python scripts/run_local.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy shared schedd agentd

test: lint typecheck
	$(VENV)/bin/python -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/python bench/submit_throughput.py
	$(VENV)/bin/python bench/event_latency.py

# Every replay behind docs/evaluation.md: make evaluation TRACES=dir OUT=dir (hours).
evaluation: $(STAMP)
	bench/evaluation.sh "$(TRACES)" "$(OUT)"

clean:
	rm -rf $(VENV) .run .pytest_cache .mypy_cache .ruff_cache
