# The two commands of the README. Each one installs what is missing first, saying so.
# Both run in the project's own virtual environment, which `setup` makes. `make demo`
# installs only that (and tmux, which its simulated nodes run jobs in): no system service,
# no sshd, nothing under /etc. What the tests need of the system (sshd, podman, Slurm,
# debootstrap…) is `make test-deps`'s, which `make test` runs first.
PYTHON ?= .venv/bin/python

.PHONY: demo test test-deps test-fast lint setup setup-demo bench bench-slurm bench-recovery bench-scale bench-nodelet bench-month

setup:
	@sh scripts/setup.sh test

setup-demo:
	@sh scripts/setup.sh demo

test-deps:
	@sh scripts/test-deps.sh

demo: setup-demo
	$(PYTHON) -m nebula_tui demo

# The suite mostly waits (for sshd, tmux, a head's next pass, a time limit): one pytest
# process keeps about 0.7 of a core busy. So on two cores JOBS workers (pytest-xdist) run
# modules side by side, each worker with its own lab; a module stays in one worker (its
# head starts once) and what the whole machine shares (Slurm, Unix users) stays in one
# (tests/conftest.py). `make test JOBS=0` runs everything in one process. The temporary
# folder is short: a worker's adds `popen-gwN/`, and a demo's tmux socket deep inside it
# would pass the 108 characters a Unix socket's path may have. It is removed after a run
# that passed, and kept for a look after one that failed.
JOBS ?= 3

test: test-deps setup
	@start=$$(date +%s); base=$$(mktemp -d /tmp/nt-XXXX); \
	$(PYTHON) -m pytest -q --durations=25 -n $(JOBS) --dist loadgroup --no-loadscope-reorder \
	    --basetemp=$$base; \
	status=$$?; [ $$status -ne 0 ] || rm -rf $$base; \
	echo "make test: $$(( $$(date +%s) - start )) s ($(JOBS) workers, $$(nproc) cores)"; \
	exit $$status

# ruff (pyproject's [tool.ruff]) and mypy, strict on the modules pyproject's [tool.mypy]
# lists (the wire's shapes and requests and views that builds them, the model, the node
# protocol, the whole scheduler, the head's request handlers and checks, why, bookings and a
# pool's view, the protocol's clients), the head's other rooms that send those shapes, where
# they are annotated, and the CLI, the client's rooms and the TUI that read them, every body.
lint: setup
	@$(PYTHON) -m ruff check --quiet . && $(PYTHON) -m mypy
	@echo "make lint: ruff and mypy passed"

# The fast layer alone, after lint: what needs no lab, head process, demo or Slurm
# (tests/unit and tests/tui, less the few lab tests of a mostly plain module; tests/lab is all lab).
test-fast: lint
	@start=$$(date +%s); base=$$(mktemp -d /tmp/nt-XXXX); \
	$(PYTHON) -m pytest -q --durations=10 -m "not lab" -n $(JOBS) --dist loadgroup --no-loadscope-reorder \
	    --basetemp=$$base; \
	status=$$?; [ $$status -ne 0 ] || rm -rf $$base; \
	echo "make test-fast: $$(( $$(date +%s) - start )) s ($(JOBS) workers, $$(nproc) cores)"; \
	exit $$status

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
