#!/usr/bin/env bash
# The whole test suite on a fresh machine: venv + install, Postgres/Redis up, ruff, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/services.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"
