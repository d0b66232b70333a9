# The README's two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench constraints clean install uninstall unit-check slurm-up slurm-down

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,plot,examples,dashboard]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	rm -rf out/demo
	$(BIN)/wardenctl drill crash --out out/demo

test: setup
	$(BIN)/pytest -n 2

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: setup
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,plot,examples,dashboard,bench]'
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/async_commit.py
	$(BIN)/python bench/peers.py
	$(BIN)/python bench/goodput.py
	$(BIN)/python bench/checkpoint.py
	$(BIN)/python bench/daemon.py
	$(BIN)/python bench/teardown.py
	$(BIN)/python bench/control.py
	$(BIN)/python bench/cli_start.py
	$(BIN)/python bench/sdk.py
	$(BIN)/python bench/dashboard.py
	$(BIN)/python bench/sharded.py
	$(BIN)/python bench/summary.py

constraints: setup
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,plot,examples,dashboard,bench]'
	{ head -n 2 constraints.txt; $(BIN)/pip freeze --exclude-editable | sort -f; } > constraints.new
	mv constraints.new constraints.txt

install:
	systemd/install.sh install

uninstall:
	systemd/install.sh uninstall

# The unit as installed (ExecStart pointing at this checkout's wardend), verified and scored.
unit-check: setup
	sed "s|/opt/jobwarden/venv|$(CURDIR)/.venv|g" systemd/wardend.service > .venv/wardend.service
	systemd-analyze verify .venv/wardend.service
	systemd-analyze security --offline=true --threshold=20 .venv/wardend.service

# A Slurm cluster of NODES compute nodes on this machine, each slurmd in its own network
# namespace (slurm/cluster.sh; as root). Its last line is the SLURM_CONF to export.
NODES ?= 2
slurm-up:
	NODES=$(NODES) slurm/cluster.sh up

slurm-down:
	slurm/cluster.sh down

clean:
	rm -rf $(VENV) out
