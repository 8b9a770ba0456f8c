# The two commands of the README, and a few helpers. Everything runs from a fresh
# Debian 12 machine: scripts/bootstrap.sh installs what is missing.
.PHONY: demo test test-unit lint down status bootstrap compose-smoke

demo:  ## Bring up the local stack and run the HA demo (servers, jobs, failover).
	scripts/demo.sh

test:  ## Install, start the local stack and run the whole test suite.
	scripts/test.sh

# On two workers; their folders under a parent of their own, not pytest's 0700 one, so
# that the driver user of the checkpoint tests can pass through to theirs.
test-unit:  ## Run the tests that need no service (tests/unit): nothing is started (docs/testing.md).
	.venv/bin/python -m pytest tests/unit -q -n 2 --basetemp="$${TMPDIR:-/tmp}/sparkring-unit-$$(id -u)"

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

bootstrap:
	scripts/bootstrap.sh

status:
	python3 scripts/stack.py status

down:  ## Stop every local service and process the demo or tests started.
	python3 scripts/stack.py down

compose-smoke:  ## Build the image and run the compose stack end to end on podman or Docker (minutes, GBs; COMPOSE_SMOKE_STANDINS=1 without a registry).
	scripts/compose-smoke.sh
