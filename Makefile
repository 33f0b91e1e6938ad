# The two commands: `make demo` (the governed flow, embedded mode) and `make test` (the suite
# against the real PostgreSQL and Redis on 127.0.0.1). Both install what they need into .venv.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell sha1sum requirements.lock | cut -c1-12)

.PHONY: install test demo lint format lock bench migrate serve worker clean

$(STAMP): requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.lock
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest $(PYTEST_ARGS)

demo: install
	$(BIN)/python scripts/demo.py

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

# Re-resolve the pinned direct dependencies (requirements.in) into requirements.lock.
lock:
	$(PYTHON) -m venv /tmp/manta-lock && /tmp/manta-lock/bin/pip install -q -r requirements.in
	/tmp/manta-lock/bin/pip freeze | grep -v '^-e' > requirements.lock && rm -rf /tmp/manta-lock

migrate: install
	$(BIN)/python manage.py migrate --noinput

serve: migrate
	$(BIN)/python manage.py runserver 127.0.0.1:8000

worker: install
	$(BIN)/celery -A config worker -l info

clean:
	rm -rf var
