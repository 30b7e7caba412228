# numa-pin: every target installs what it needs on a fresh Debian 12 machine (as root).
SHELL      := /bin/bash
PYTHON     ?= python3
VENV       := .venv
VPY        := $(VENV)/bin/python
STAMP      := $(VENV)/.installed
# what `make deb` needs: dpkg-deb, and Debian's python3 + setuptools 66 to build the wheel
DEB_PKGS   := dpkg python3 python3-setuptools python3-wheel
# Debian packages: build deps for python-prctl, the lstopo oracle, real runtimes for e2e,
# and qemu + a stock kernel for the multi-NUMA guest; containerd (with ctr) for its e2e tier;
# Debian's own python3 modules for the deb tier (the package runs on /usr/bin/python3);
# debootstrap and e2fsprogs (mkfs.ext4 -d) build the systemd guest of the VM tier, buildah the DaemonSet's image
# the NRI guests run as their plugin; docker.io
# for the Docker Engine tier (its test starts a private dockerd; the package's own is not started).
APT_PKGS   := python3 python3-venv python3-dev gcc make libcap-dev hwloc runc crun podman \
              busybox-static iproute2 util-linux procps kmod qemu-system-x86 linux-image-amd64 \
              debootstrap e2fsprogs buildah \
              containerd docker.io libbpf1 $(DEB_PKGS) python3-psutil python3-pyroute2 python3-prctl python3-yaml \
              python3-prometheus-client python3-protobuf python3-grpcio chromium
PYTEST_ARGS ?=

.PHONY: all deps venv demo lint test test-fast stress bench deb clean nri-descriptors podresources-descriptors image \
        image-archive image-test

all: test

deps:
	@bash packaging/scripts/install-deps.sh $(APT_PKGS)

$(STAMP): pyproject.toml | deps
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[test]' virtme-ng
	$(VPY) packaging/scripts/write-hook-launcher.py $(CURDIR)/$(VENV)/bin/python $(VENV)/bin/numa-pin-hook
	$(VPY) packaging/scripts/write-hook-launcher.py $(CURDIR)/$(VENV)/bin/python $(VENV)/bin/numa-pin-runc
	$(VPY) -m compileall -q src/numa_pin
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	@bash packaging/scripts/demo.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy

# the image tier too: the DaemonSet's image is built and run under podman (about 3 minutes)
test: lint
	NUMA_PIN_IMAGE_TEST=1 $(VPY) -m pytest $(PYTEST_ARGS)

test-fast: lint
	$(VPY) -m pytest -m "not e2e and not vm and not root and not deb and not browser and not image" $(PYTEST_ARGS)

# 10,000 hostile hook inputs (FIFOs, deep nesting, symlinked state files, control characters),
# SIGKILL at random instants of admissions and releases (in-process and the agent's children),
# 64 admissions at once, a decision that never ends, and bursts of 16 to 256 admissions on
# big-64node in-process, through the agent and mixed with releases (tests/service/test_node_stress.py;
# STRESS_BURSTS=16,32 runs fewer), and the fault mode: ENOSPC and EIO at random ledger writes, the
# node's invariants checked after each operation (tests/service/test_node_faults_stress.py;
# STRESS_FAULTS=N operations); figures in stress-report.json. STRESS_EXAMPLES=N changes the count.
# The fake node lives on tmpfs (STRESS_TMP): every admission fsyncs the ledger, and on a busy disk
# that, not numa-pin, would be what is measured.
STRESS_EXAMPLES ?= 10000
STRESS_FAULTS ?= 2000
STRESS_BURSTS ?= 16,32,64,128,256
STRESS_TMP ?= $(if $(wildcard /dev/shm),/dev/shm/numa-pin-stress,$(CURDIR)/.stress-tmp)
stress: $(STAMP)
	NUMA_PIN_STRESS=1 NUMA_PIN_STRESS_EXAMPLES=$(STRESS_EXAMPLES) NUMA_PIN_STRESS_REPORT=stress-report.json \
		NUMA_PIN_STRESS_FAULTS=$(STRESS_FAULTS) NUMA_PIN_STRESS_BURSTS=$(STRESS_BURSTS) \
		$(VPY) -m pytest -q -s -p no:cacheprovider --basetemp=$(STRESS_TMP) tests/hook/test_hook_stress.py \
		tests/service/test_node_stress.py tests/service/test_node_faults_stress.py \
		$(PYTEST_ARGS)

bench: $(STAMP)
	$(VPY) bench/merge_scaling.py
	$(VPY) bench/prefer_closest.py
	$(VPY) bench/hook_latency.py
	$(VPY) bench/population.py

# numa-pin_<version>_all.deb in this directory, from Debian's python3 (no venv needed)
# NRI's protobuf descriptors, from the vendored .proto files (tests/nri/test_messages.py checks them)
nri-descriptors: $(STAMP)
	$(VENV)/bin/python -m grpc_tools.protoc --include_imports --descriptor_set_out=src/numa_pin/nri/descriptors.binpb \
		-Ithird_party/nri api.proto ttrpc.proto

podresources-descriptors: $(STAMP)
	$(VENV)/bin/python -m grpc_tools.protoc --include_imports \
		--descriptor_set_out=src/numa_pin/podresources/descriptors.binpb -Ithird_party/podresources api.proto

deb:
	@bash packaging/scripts/install-deps.sh $(DEB_PKGS)
	@bash packaging/scripts/build-deb.sh

# the NRI plugin's container image, localhost/numa-pin:<version>, from a debootstrap'd Debian 12 root
# and the deb (no registry; root): about 3 minutes the first time, 20 s once the root is cached
# (.cache/image-root); image-archive also saves it for `ctr -n k8s.io images import`
# (docs/kubernetes-deploy.md); image-test builds it and runs it under podman (`make test` does too)
VERSION    := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n1)
IMAGE_PKGS := debootstrap buildah podman runc $(DEB_PKGS)
image:
	@bash packaging/scripts/install-deps.sh $(IMAGE_PKGS)
	@bash packaging/image/build-image.sh

image-archive:
	@bash packaging/scripts/install-deps.sh $(IMAGE_PKGS)
	@bash packaging/image/build-image.sh --archive numa-pin-image_$(VERSION).tar

image-test: $(STAMP)
	@bash packaging/scripts/install-deps.sh $(IMAGE_PKGS)
	NUMA_PIN_IMAGE_TEST=1 $(VPY) -m pytest -q -m image tests/deploy $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis numa-pin_*_all.deb numa-pin-image_*.tar
