# One-command entry points. `make test` is what CI runs (.ci/run) and what README tells a new user.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Where the demo listens: `make demo PORT=8765` (every demo target).
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: test demo demo-gunicorn demo-uvicorn demo-redis demo-cluster bench bench-peers lint docs clean

# tox >= 4.5x may leave a PEP 832 ".venv" redirect *file* here (tox.ini now turns that off): replace it.
$(VENV)/.installed: pyproject.toml
	@if [ -e $(VENV) ] && [ ! -d $(VENV) ]; then echo "$(VENV) is a file (a tox venv redirect): replacing it with the project venv"; rm -f $(VENV); fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,drf,prometheus,redis,demo]"
	touch $@

test: $(VENV)/.installed
	$(PY) -m pytest

demo: $(VENV)/.installed
	cd demo_project && ../$(PY) manage.py migrate --noinput && ../$(PY) manage.py runserver $(HOST):$(PORT)

# The same demo under production servers (docs/demo.md). demo_project/serve.py makes a fresh
# PROMETHEUS_MULTIPROC_DIR, shares the simulated partner between workers, and cleans up on Ctrl-C.
demo-gunicorn: $(VENV)/.installed   # 4 workers, in-memory backend: per-process state, on purpose
	cd demo_project && ../$(PY) serve.py gunicorn --workers 4 --host $(HOST) --port $(PORT) --migrate

demo-uvicorn: $(VENV)/.installed    # demo.asgi:application with the stall detector; try /block?ms=100
	cd demo_project && ../$(PY) serve.py uvicorn --host $(HOST) --port $(PORT) --migrate

demo-redis: $(VENV)/.installed      # gunicorn, 4 workers, rate limits in Redis on 127.0.0.1:6379
	cd demo_project && ../$(PY) serve.py gunicorn --workers 4 --backend redis --host $(HOST) --port $(PORT) --migrate

# Two gunicorn "hosts" (ports PORT and PORT+1) x 2 workers sharing Redis, with the control plane: r4 status
# lists all 4 workers, r4 transition reaches them all (docs/demo.md).
demo-cluster: $(VENV)/.installed
	cd demo_project && ../$(PY) serve.py gunicorn --hosts 2 --workers 2 --backend redis --control --host $(HOST) --port $(PORT) --migrate

bench: $(VENV)/.installed
	$(PY) benchmarks/run.py

# Our primitives side by side with django-ratelimit, DRF, limits, pybreaker and purgatory (benchmarks/README.md).
bench-peers: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) benchmarks/run.py peers

lint: $(VENV)/.installed
	$(PY) -m pip install --quiet ".[dev]"
	$(VENV)/bin/ruff check . && $(VENV)/bin/mypy django_ratelimit_r4

# The documentation site (mkdocs.yml) into site/; --strict makes a broken link or anchor an error.
docs: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis site
