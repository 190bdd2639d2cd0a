#!/usr/bin/env bash
# The whole test suite on a fresh machine: venv + install, Postgres/Redis up, then ruff, the
# architecture contracts (lint-imports), mypy, and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/services.sh
.venv/bin/ruff check .
# import-linter reads the package as installed (genjob.worker → worker/ …) from build/package-tree.
(cd build/package-tree && ../../.venv/bin/lint-imports ../../pyproject.toml --no-cache --no-logo)
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
