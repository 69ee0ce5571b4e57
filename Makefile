# The two commands of the README. Each one installs what is missing first.
# Both run in the project's own virtual environment, which `setup` makes.
PYTHON ?= .venv/bin/python

.PHONY: demo test setup bench bench-slurm bench-recovery bench-scale bench-nodelet bench-month

setup:
	@sh scripts/setup.sh

demo: setup
	$(PYTHON) -m nebula_tui demo

test: setup
	$(PYTHON) -m pytest -q --durations=25

bench: setup
	$(PYTHON) bench/submit_latency.py && $(PYTHON) bench/throughput.py

# NebulaGrid and real Slurm (installed with apt when missing; needs root) in one run.
bench-slurm: setup
	$(PYTHON) bench/vs_slurm.py

# The node side alone: one nodelet and its tmux server, CPU per job, control client vs processes.
bench-nodelet: setup
	$(PYTHON) bench/nodelet.py

# The head killed with SIGKILL under 100 nodes and 400 jobs, and restarted.
bench-recovery: setup
	$(PYTHON) bench/recovery.py

# The head against 100, 250 and 500 simulated nodes with 10,000 jobs waiting.
bench-scale: setup
	$(PYTHON) bench/scale.py

# A lab month replayed through the scheduler in virtual time, against the spreadsheet and
# Slurm-like baselines: the demo lab and a 20-node lab.
bench-month: setup
	$(PYTHON) bench/lab_month.py
