"""Build the example jobs examples/<task>.jsonl: OpenAI Batch chat lines of the kinds people batch.

One file per task of bench/task_prompts.py (rewrite, extract, summarize, classify, write), each
built from the text of its EXAMPLE_PACKAGES as installed in this venv, whose versions
constraints.txt pins: the same versions always give the same files. --check writes nothing and
exits 1 if a file differs from what it would build (and says so when an installed version is not
the pinned one, which changes the text).

    .venv/bin/python scripts/build_examples.py            # write examples/*.jsonl
    .venv/bin/python scripts/build_examples.py --check    # exit 1 if they are stale
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import task_prompts  # noqa: E402  (bench/task_prompts.py)

EXAMPLES = ROOT / "examples"
CONSTRAINTS = ROOT / "constraints.txt"
LINES_PER_TASK = {"classify": 24}  # the others: --n
DEFAULT_LINES = 16


def example_path(task: str) -> Path:
    return EXAMPLES / f"{task}.jsonl"


def build(task: str, n: int, seed: int = 0) -> str:
    """The text of examples/<task>.jsonl: one JSON object a line, in the order chat_lines gives."""
    lines = task_prompts.chat_lines(task, task_prompts.EXAMPLE_PACKAGES, n, seed=seed)
    if len(lines) < n:
        raise SystemExit(f"{task}: only {len(lines)} of {n} lines in {task_prompts.EXAMPLE_PACKAGES}")
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_versions() -> dict[str, str]:
    """{normalized distribution name: version} from constraints.txt."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            pins[normalized(name)] = version.strip()
    return pins


def package_versions(packages: tuple[str, ...]) -> dict[str, tuple[str, str, str | None]]:
    """{import name: (distribution, installed version, pinned version)}, read from metadata (the
    packages themselves are never imported)."""
    distributions = importlib.metadata.packages_distributions()
    pins = pinned_versions()
    versions = {}
    for package in packages:
        distribution = distributions.get(package, [package])[0]
        installed = importlib.metadata.version(distribution)
        versions[package] = (distribution, installed, pins.get(normalized(distribution)))
    return versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    parser.add_argument("--n", type=int, default=DEFAULT_LINES, help="lines per task (classify: 24)")
    parser.add_argument("--tasks", default=",".join(task_prompts.TASKS), help="comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    for package, (distribution, installed, pinned) in package_versions(task_prompts.EXAMPLE_PACKAGES).items():
        if installed != pinned:
            print(
                f"warning: {package} is {distribution}=={installed} here, constraints.txt pins {pinned}",
                file=sys.stderr,
            )
    stale = []
    for task in args.tasks.split(","):
        n = LINES_PER_TASK.get(task, args.n)
        text = build(task, n, args.seed)
        path = example_path(task)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path.relative_to(ROOT).as_posix())
        else:
            path.write_text(text, encoding="utf-8")
            print(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
    if stale:
        print(f"stale (rebuild with scripts/build_examples.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
