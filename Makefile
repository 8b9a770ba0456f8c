# The two commands of the README, and a few helpers. Everything runs from a fresh
# Debian 12 machine: scripts/bootstrap.sh installs what is missing.
.PHONY: demo test lint down status bootstrap

demo:  ## Bring up the local stack and run the HA demo (servers, jobs, failover).
	scripts/demo.sh

test:  ## Install, start the local stack and run the whole test suite.
	scripts/test.sh

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

bootstrap:
	scripts/bootstrap.sh

status:
	python3 scripts/stack.py status

down:  ## Stop every local service and process the demo or tests started.
	python3 scripts/stack.py down
