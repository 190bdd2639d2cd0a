#!/usr/bin/env bash
# Create .venv and install genjob with its test tools. torch goes first, pinned to the CPU wheel
# on this machine's disk (pip install torch==2.13.0), so nothing pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.genjob-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "==> installing torch==2.13.0, then genjob[test]" >&2
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet torch==2.13.0
  .venv/bin/python -m pip install --quiet -e '.[test]'
  touch "$stamp"
fi
.venv/bin/python -c "import torch, transformers, celery, genjob; assert torch.__version__.startswith('2.13')" \
  || { echo "bootstrap: the installed environment is broken" >&2; exit 1; }
