# The two commands: `make demo` (the governed flow, embedded mode) and `make test` (the suite
# against the real PostgreSQL and Redis on 127.0.0.1). Both install what they need into .venv.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.lock requirements-dev.lock cli/pyproject.toml | sha1sum | cut -c1-12)

.PHONY: install test-tools system-deps test-deps test demo lint format lock bench migrate serve worker clean

# Debian packages the local target's sandbox uses, as command:package (util-linux's
# unshare/nsenter/setpriv/mount are on every Debian): slirp4netns gives sandboxes outbound NAT,
# nft loads each cluster's egress policy, mkfs.ext4 makes each cluster's disk, and libseccomp
# compiles its seccomp filter. Installed when run as root with apt; elsewhere the worker says at
# start-up what it lacks. The tests also drive Debian's Chromium (the console's browser tests)
# and run a real Prometheus (its alert rules checked by promtool).
SYSTEM_TOOLS := slirp4netns:slirp4netns nft:nftables mkfs.ext4:e2fsprogs
TEST_TOOLS := chromium:chromium prometheus:prometheus promtool:prometheus
SYSTEM_LIBS := libseccomp.so.2:libseccomp2

# The stamp's name holds the hash of what it installed: a fresh checkout (new mtimes) with the
# same files reuses the installed .venv. The dev venv gets requirements-dev.lock (the runtime set
# of requirements.lock plus the test tools and linters); the server image only requirements.lock.
$(STAMP): | requirements.lock requirements-dev.lock cli/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements-dev.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -e ./cli
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# openapi-python-client (tests/test_openapi_client.py generates a client from the schema with
# it) pins httpx and typer below the project's own, so it gets a venv of its own.
OPENAPI_VENV := .venv-openapi
OPENAPI_STAMP := $(OPENAPI_VENV)/.installed-$(shell cat requirements-openapi.lock | sha1sum | cut -c1-12)

$(OPENAPI_STAMP): | requirements-openapi.lock
	test -x $(OPENAPI_VENV)/bin/python || $(PYTHON) -m venv $(OPENAPI_VENV)
	$(OPENAPI_VENV)/bin/python -m pip install -q --disable-pip-version-check -r requirements-openapi.lock
	rm -f $(OPENAPI_VENV)/.installed-*
	touch $(OPENAPI_STAMP)

install: $(STAMP)

# What only the tests use beyond .venv (make test runs it; make serve and make demo do not).
test-tools: $(OPENAPI_STAMP)

# apt-get install the packages of the command:package / library:package pairs that are missing.
define apt_missing
missing=""; \
for pair in $(1); do PATH="$$PATH:/usr/sbin:/sbin" command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair#*:}"; done; \
for pair in $(2); do /sbin/ldconfig -p | grep -q "$${pair%%:*}" || missing="$$missing $${pair#*:}"; done; \
if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
  echo "installing$$missing"; \
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null || \
  { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null; }; \
fi
endef

system-deps:
	@$(call apt_missing,$(SYSTEM_TOOLS),$(SYSTEM_LIBS))

test-deps:
	@$(call apt_missing,$(TEST_TOOLS),)

# The tests that start no cluster, worker or sandbox run in two processes (each with its own
# database, Redis database and dirs: tests/settings.py); then those that do (marked `alone` by
# tests/conftest.py), two files at a time, most of their time spent waiting on Ray and sleeping
# jobs; then, one at a time, those marked `whole_host` (they measure the host's disk or a CPU,
# lease its GPUs or time themselves). PYTEST_ARGS goes to all three; a phase it leaves without
# tests (exit status 5) is not a failure.
test: install test-tools system-deps test-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -n 2 --dist loadfile -m "not alone" $(PYTEST_ARGS) || [ $$? = 5 ]
	$(BIN)/pytest -n 2 --dist loadfile -m "alone and not whole_host" $(PYTEST_ARGS) || [ $$? = 5 ]
	$(BIN)/pytest -m whole_host $(PYTEST_ARGS) || [ $$? = 5 ]

demo: install system-deps
	$(BIN)/python scripts/demo.py

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

# Re-resolve the pinned direct dependencies in a throwaway venv: requirements.in into
# requirements.lock (the server image's set), then requirements-dev.in on top of exactly those
# versions into requirements-dev.lock (the dev venv's set; a dev tool that needs another version
# of a runtime dependency fails here instead of drifting from the image); and
# requirements-openapi.in, alone, into requirements-openapi.lock (the tool venv's set).
LOCK_VENV := /tmp/manta-lock
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q -r requirements.in
	$(LOCK_VENV)/bin/pip freeze | grep -v '^-e' > $(LOCK_VENV)/requirements.lock
	$(LOCK_VENV)/bin/pip install -q -r requirements-dev.in -c $(LOCK_VENV)/requirements.lock
	$(LOCK_VENV)/bin/pip freeze | grep -v '^-e' > $(LOCK_VENV)/requirements-dev.lock
	cp $(LOCK_VENV)/requirements.lock $(LOCK_VENV)/requirements-dev.lock . && rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV) && $(LOCK_VENV)/bin/pip install -q -r requirements-openapi.in
	{ head -1 requirements-openapi.lock; $(LOCK_VENV)/bin/pip freeze | grep -v '^-e' | sort -f; } \
	  > $(LOCK_VENV)/requirements-openapi.lock
	cp $(LOCK_VENV)/requirements-openapi.lock . && rm -rf $(LOCK_VENV)

migrate: install
	$(BIN)/python manage.py migrate --noinput

PORT ?= 8000

serve: migrate
	$(BIN)/python manage.py runserver 127.0.0.1:$(PORT)

# One worker per queue (config/settings.py): the job lifecycle's (the default queue:
# admission, launch, follow, cancel, the sweeps) and the webhooks' (outbox dispatcher,
# deliveries, emails). Two processes, because one worker consuming both queues gives its pool
# to whichever task comes first: a backlog of slow deliveries would hold every process, and
# every launch behind it. Stopping make (Ctrl-C, or SIGTERM to its process group) stops both.
worker: install system-deps
	$(BIN)/celery -A config worker -l info -Q webhooks -n webhooks@%h & webhooks=$$!; \
	trap 'kill $$webhooks 2>/dev/null; wait $$webhooks' EXIT INT TERM; \
	$(BIN)/celery -A config worker -l info -Q celery -n jobs@%h

clean:
	rm -rf var
