# The two commands of the README. Each one installs what is missing first.
# Both run in the project's own virtual environment, which `setup` makes.
PYTHON ?= .venv/bin/python

.PHONY: demo test setup bench

setup:
	@sh scripts/setup.sh

demo: setup
	$(PYTHON) -m nebula_tui demo

test: setup
	$(PYTHON) -m pytest -q

bench: setup
	$(PYTHON) bench/submit_latency.py && $(PYTHON) bench/throughput.py
