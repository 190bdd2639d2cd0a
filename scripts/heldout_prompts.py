"""The demo pair's data split and its held-out prompt sets (deterministic; no randomness, no network).

Stdlib files (``sysconfig.get_paths()["stdlib"]``, recursive ``*.py``, relative POSIX path ``rel``):

* skipped (neither trained on nor used for prompts): a directory component in ``SKIP_DIRS``
  (``site-packages``, ``test``/``tests``/``idle_test`` test suites, ``pydoc_data`` prose tables,
  ``__pycache__``); files that do not parse; generated tables (codecs made by ``gencodec.py``, and
  files where over half the non-blank lines are bare literal entries: ``html/entities.py``,
  ``_sysconfigdata*``, ``encodings/aliases.py``, ``locale.py``, ...).
* held out: the 8 legacy held-out files (top-level ``*.py`` with the smallest md5 of the name, the
  old pair's rule: _collections_abc, crypt, heapq, inspect, optparse, pyclbr, runpy, socketserver),
  and every file with ``int(md5(rel)[:8], 16) % 32 == 0``.
* trained on: the rest.

Prompts (``bench/prompts/heldout.jsonl``, genjob input format ``{"id", "prompt"}``), drawn from the
held-out stdlib files and from the third-party packages in ``PACKAGES`` (site-packages; never trained
on). A candidate is a ``def``/``async def`` (any nesting; for long prompts also a ``class``): its
source from the first decorator, dedented, cut after the last whole line that keeps it at most
``T`` tokens (demo tokenizer; no trailing newline), with ``h = int(md5(id)[:8], 16)``:
``T = 20 + h % 101`` (short) or ``200 + h % 241`` (long). A candidate is kept if it has >= 20 (short)
or >= 200 (long) tokens and the definition goes on after the cut. In each group (held-out stdlib,
and each package) candidates are ranked by md5 of their id; groups are taken round-robin, long
ones first (each definition is used once), until ``N_LONG`` long (stdlib gets ``STDLIB_SHARE`` of
each count) and ``N_SHORT`` short prompts are in. ``examples/prompts.jsonl`` (the demo's prompts)
is the first ``N_EXAMPLES`` short stdlib ones.

    .venv/bin/python scripts/heldout_prompts.py [--tokenizer models/demo/target]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sysconfig
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SITE = Path(sysconfig.get_paths()["purelib"])
SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "pydoc_data", "__pycache__"}
LEGACY_HELDOUT = (
    "_collections_abc.py",
    "crypt.py",
    "heapq.py",
    "inspect.py",
    "optparse.py",
    "pyclbr.py",
    "runpy.py",
    "socketserver.py",
)
HOLDOUT_MOD = 32
PACKAGES = ("click", "rich", "sqlalchemy", "celery", "kombu", "pydantic", "fastapi", "starlette", "alembic")
N_SHORT, N_LONG, N_EXAMPLES, STDLIB_SHARE = 200, 60, 12, 0.4
SHORT, LONG = (20, 120), (200, 440)
_DATA_LINE = re.compile(r"""^\s*(['"(]|0x|\d|[bu]?['"]).*([,:]|['"])\s*(#.*)?$""")


def md5_int(text: str) -> int:
    return int(hashlib.md5(text.encode()).hexdigest()[:8], 16)


def is_table(text: str) -> bool:
    """Generated data rather than code: a gencodec.py codec, or mostly bare literal lines."""
    lines = [line for line in text.splitlines() if line.strip()]
    return "gencodec.py" in text or sum(map(bool, map(_DATA_LINE.match, lines))) > len(lines) / 2


def stdlib_split() -> tuple[list[Path], list[Path], list[Path]]:
    """(train, held-out, skipped) stdlib files, each sorted by relative path (rule in the docstring)."""
    top = sorted(STDLIB.glob("*.py"), key=lambda p: hashlib.md5(p.name.encode()).hexdigest())
    legacy = {p.name for p in top[: len(LEGACY_HELDOUT)]}
    assert legacy == set(LEGACY_HELDOUT), legacy  # the old pair's rule still picks the same 8 files
    train, held, skipped = [], [], []
    for path in sorted(STDLIB.rglob("*.py"), key=lambda p: p.relative_to(STDLIB).as_posix()):
        rel = path.relative_to(STDLIB).as_posix()
        if SKIP_DIRS & set(rel.split("/")[:-1]):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            ast.parse(text)
        except SyntaxError:
            skipped.append(path)
            continue
        if is_table(text):
            skipped.append(path)
        elif rel in LEGACY_HELDOUT or md5_int(rel) % HOLDOUT_MOD == 0:
            held.append(path)
        else:
            train.append(path)
    return train, held, skipped


def legacy_files() -> list[Path]:
    return [STDLIB / name for name in LEGACY_HELDOUT]


# ----------------------------------------------------------------------------- prompts
def definitions(src: str, classes: bool) -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of every def (and class if ``classes``) in a module, in source order."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            name = f"{prefix}{getattr(child, 'name', '')}"
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) or (
                classes and isinstance(child, ast.ClassDef)
            ):
                yield name, child
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                yield from walk(child, f"{name}.")

    yield from walk(ast.parse(src), "")


def cut(lines: list[str], node: ast.AST, limit: int, count: Callable[[str], int]) -> tuple[str, str] | None:
    """The definition's dedented source cut after the last whole line within ``limit`` tokens: (prompt,
    the rest of the definition from the newline after the prompt on)."""
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
    body = textwrap.dedent("".join(lines[start : node.end_lineno])).rstrip().split("\n")
    if body[0][:1].isspace():  # a multi-line string at column 0 defeats dedent: skip
        return None
    keep, lo, hi = 0, 1, len(body) - 1  # the largest prefix < whole definition within the limit
    while lo <= hi:
        mid = (lo + hi) // 2
        if count("\n".join(body[:mid]).rstrip()) <= limit:
            keep, lo = mid, mid + 1
        else:
            hi = mid - 1
    text = "\n".join(body[:keep]).rstrip()
    return (text, "\n".join(body)[len(text) :]) if keep else None


def candidates(
    group: str, root: Path, files: list[Path], long: bool, count: Callable[[str], int]
) -> list[dict[str, str]]:
    out = []
    lo, hi = LONG if long else SHORT
    for path in files:
        src = path.read_text(encoding="utf-8", errors="replace")
        lines, rel = src.splitlines(keepends=True), path.relative_to(root).as_posix()
        try:
            defs = list(definitions(src, classes=long))
        except SyntaxError:
            continue
        for name, node in defs:
            ident = f"{group}:{rel}:{name}"
            limit = lo + md5_int(ident) % (hi - lo + 1)
            pair = cut(lines, node, limit, count)
            if pair is not None and count(pair[0]) >= lo:
                out.append({"id": ident, "prompt": pair[0], "rest": pair[1]})
    return sorted(out, key=lambda p: hashlib.md5(p["id"].encode()).hexdigest())


def round_robin(groups: list[list[dict[str, str]]], n: int, used: set[str]) -> list[dict[str, str]]:
    """Up to ``n`` prompts taking one per group in turn, skipping definitions already ``used``."""
    out, iters = [], [iter(g) for g in groups]
    while len(out) < n and iters:
        for it in list(iters):
            p = next((p for p in it if p["id"] not in used), None)
            if p is None:
                iters.remove(it)
                continue
            used.add(p["id"])
            out.append(p)
            if len(out) == n:
                break
    return out


def build_prompts(count: Callable[[str], int]) -> list[dict[str, str]]:
    """The held-out prompt set: long ones first, then short ones (rule in the module docstring)."""
    held = stdlib_split()[1]
    sources = [("stdlib", STDLIB, held)]
    for pkg in PACKAGES:
        files = sorted((SITE / pkg).rglob("*.py"))
        sources.append((pkg, SITE, [f for f in files if "__pycache__" not in f.parts]))
    used: set[str] = set()
    prompts: list[dict[str, str]] = []
    for long, n, tag in ((True, N_LONG, "#long"), (False, N_SHORT, "")):
        groups = [candidates(g, root, files, long, count) for g, root, files in sources]
        n_std = round(n * STDLIB_SHARE)
        chosen = round_robin(groups[:1], n_std, used) + round_robin(groups[1:], n - n_std, used)
        prompts += [dict(p, id=p["id"] + tag) for p in chosen]
    return prompts


def write_prompt_files(tokenizer, heldout_out: Path, examples_out: Path) -> list[dict[str, str]]:
    """Writes both files (``id`` and ``prompt`` only); returns the prompts with ``rest``, the source's
    own continuation (the rest of the definition), for reference statistics."""

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompts = build_prompts(count)
    examples = [p for p in prompts if p["id"].startswith("stdlib:") and "#long" not in p["id"]][:N_EXAMPLES]
    for path, rows in ((heldout_out, prompts), (examples_out, examples)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"id": p["id"], "prompt": p["prompt"]}) + "\n" for p in rows))
    return prompts


def length_summary(lengths: list[int]) -> dict[str, int]:
    bins = [(0, 19), (20, 60), (61, 120), (121, 199), (200, 320), (321, 440), (441, 10**6)]
    return {f"{a}-{b}" if b < 10**6 else f">{a - 1}": sum(a <= n <= b for n in lengths) for a, b in bins}


def main() -> None:
    from transformers import AutoTokenizer

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokenizer", default="models/demo/target")
    p.add_argument("--out", type=Path, default=Path("bench/prompts/heldout.jsonl"))
    p.add_argument("--examples-out", type=Path, default=Path("examples/prompts.jsonl"))
    args = p.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    prompts = write_prompt_files(tok, args.out, args.examples_out)
    lengths = [len(tok(p["prompt"])["input_ids"]) for p in prompts]
    train, held, skipped = stdlib_split()
    print(f"stdlib: {len(train)} train, {len(held)} held-out, {len(skipped)} skipped files")
    print(f"{len(prompts)} prompts -> {args.out}; token lengths {length_summary(lengths)}")
    print("sources:", {g: sum(p["id"].startswith(g + ":") for p in prompts) for g in ("stdlib", *PACKAGES)})


if __name__ == "__main__":
    main()
