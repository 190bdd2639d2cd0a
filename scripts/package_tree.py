"""Mirror the installed layout of the package as symlinks: build/package-tree/genjob/worker → worker/ …

pyproject maps the top-level folders worker/, api/, generation/ and migrations/ to genjob.worker,
genjob.api, genjob.generation and genjob.migrations ([tool.setuptools.package-dir]). The editable
install serves that mapping through an import hook, which the static tools (mypy, import-linter)
cannot follow; they read this tree instead. Rebuilt from scratch on every run (scripts/bootstrap.sh
runs it), so new and deleted modules are always seen; the links point at the real files.
Usage: python scripts/package_tree.py [ROOT]   (prints the tree's path)
"""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

TREE = Path("build") / "package-tree"
SKIP = {"__pycache__"}


def build_tree(root: Path) -> Path:
    mapping: dict[str, str] = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]["package-dir"]
    tree = root / TREE
    shutil.rmtree(tree, ignore_errors=True)
    for package in sorted(mapping, key=lambda name: name.count(".")):
        source = root / mapping[package]
        target = tree.joinpath(*package.split("."))
        children = {name.rpartition(".")[2] for name in mapping if name.rpartition(".")[0] == package}
        target.mkdir(parents=True, exist_ok=True)
        for entry in sorted(source.iterdir()):
            if entry.name not in SKIP and entry.name not in children:
                (target / entry.name).symlink_to(os.path.relpath(entry, target))
    return tree


if __name__ == "__main__":
    print(build_tree(Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()))
