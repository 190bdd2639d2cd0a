#!/usr/bin/env bash
# Write constraints.txt from the working .venv: the exact versions scripts/bootstrap.sh installs
# (pip install -c constraints.txt ...). Run after changing the dependencies in pyproject.toml and
# checking that the suite passes with what pip resolved. torch's local label (+cpu) is dropped, so
# the pin holds for the CPU wheel here and for a CUDA build elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
{
  echo "# Pinned versions for scripts/bootstrap.sh; regenerate with scripts/lock.sh, never by hand."
  .venv/bin/python -m pip freeze --all --exclude-editable --disable-pip-version-check \
    | grep -v -i '^genjob[ =@]' | sed -E 's/^(torch==[^+]+)\+.*/\1/' | LC_ALL=C sort -f
} > constraints.txt
echo "wrote constraints.txt ($(grep -vc '^#' constraints.txt) pins)" >&2
