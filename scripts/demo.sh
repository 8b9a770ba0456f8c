#!/usr/bin/env bash
# The README's first command: install what is missing, bring the local stack up,
# migrate the database and run the HA demo (scripts/demo.py). 'make down' stops all.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
.venv/bin/python scripts/stack.py up >/dev/null
eval "$(.venv/bin/python scripts/stack.py env)"
.venv/bin/sparkring db upgrade
if [ -f scripts/demo.py ]; then  # run as a module: it imports the harness (testing/)
  exec .venv/bin/python -m scripts.demo "$@"
fi
.venv/bin/python scripts/stack.py status
echo "stack is up; stop everything with: make down"
