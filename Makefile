# Two commands from a fresh clone: `make run` and `make test` (see README).
PYTHON   ?= python3.11
VENV     ?= .venv
BIN      := $(VENV)/bin
CACHE    := .cache
S3_PORT  ?= 9000
VOICE_URI ?= s3://voices/en_US-joe-medium

.PHONY: install system-packages run test bench load lint image manifests validate clean

install: $(VENV)/.installed

# Re-installs when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

# testing/local.py: reuses an S3 already answering on S3_PORT or starts moto there, publishes the
# default voice, then runs the predictor in the foreground and prints curl commands once it is ready.
run: install
	$(BIN)/python -m testing.local --s3-port $(S3_PORT) --voice-uri $(VOICE_URI)

# Debian programs the tests start for real: Prometheus (PromQL of the manifests) and nginx (mirroring).
SYSTEM_PACKAGES := prometheus nginx
system-packages:
	@missing=""; for p in $(SYSTEM_PACKAGES); do command -v $$p >/dev/null || [ -x /usr/sbin/$$p ] || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

test: install system-packages
	$(BIN)/python -m pytest -q

# Render every overlay of knative/ and keda/ to .cache/manifests/<flavour>-<overlay>.yaml.
manifests: install
	$(BIN)/python -m tests.manifests render

# Validate every rendered object strictly (schemas, lints, cross-checks); no cluster needed.
validate: install
	$(BIN)/python -m tests.manifests validate

bench: install
	$(BIN)/python -m bench

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

lint: install
	$(BIN)/hadolint Dockerfile

image:
	docker build -t tts-predictor:dev .

clean:
	rm -rf $(CACHE) $(VENV)
