# numa-pin: every target installs what it needs on a fresh Debian 12 machine (as root).
SHELL      := /bin/bash
PYTHON     ?= python3
VENV       := .venv
VPY        := $(VENV)/bin/python
STAMP      := $(VENV)/.installed
# Debian packages: build deps for python-prctl, the lstopo oracle, real runtimes for e2e,
# and qemu + a stock kernel for the multi-NUMA guest.
APT_PKGS   := python3 python3-venv python3-dev gcc make libcap-dev hwloc runc crun podman \
              busybox-static iproute2 util-linux procps kmod qemu-system-x86 linux-image-amd64
PYTEST_ARGS ?=

.PHONY: all deps venv demo test test-fast bench clean

all: test

deps:
	@bash packaging/scripts/install-deps.sh $(APT_PKGS)

$(STAMP): pyproject.toml | deps
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[test]' virtme-ng
	$(VPY) -m compileall -q src/numa_pin
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	@bash packaging/scripts/demo.sh

test: $(STAMP)
	$(VPY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(VPY) -m pytest -m "not e2e and not vm" $(PYTEST_ARGS)

bench: $(STAMP)
	$(VPY) bench/merge_scaling.py
	$(VPY) bench/prefer_closest.py
	$(VPY) bench/hook_latency.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis
