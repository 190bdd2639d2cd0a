"""Chat prompts of the kinds people batch, built from text that ships in installed Python packages.

Five task kinds (``TASKS``), each an OpenAI Batch chat line (``chat_lines``) whose user message is an
instruction and a piece of a package's own text:

* ``rewrite``: a function's source, to give back with type hints (the output copies most of the prompt);
* ``extract``: a function's source, to describe as a JSON object (names copied from the prompt);
* ``summarize``: a long docstring (80–300 words of prose), in two sentences (partly copied);
* ``classify``: a function's source, to label with one word of ``CLASSIFY_LABELS`` (a few tokens);
* ``write``: a topic (a module's or class's docstring, its first sentence), open-ended writing on it.

The text is read, never imported (some packages have import side effects or missing optional
dependencies): each package's files are found on ``sys.path`` by ``importlib.machinery.PathFinder``
(``importlib.util.find_spec`` gives an imported package's ``__spec__``, and kombu's is None once
imported) and parsed with ``ast``.
Files are walked in sorted order, test suites and vendored copies are skipped, and each package's
candidates are shuffled by a ``random.Random`` seeded with the seed, task and package, so the same
installed versions (``constraints.txt``) give the same lines. ``EXAMPLE_PACKAGES`` make the committed
``examples/*.jsonl`` (``scripts/build_examples.py``); ``HELDOUT_PACKAGES``, disjoint from them, are
for benchmarks only (``bench/tasks.py``), so no benchmark prompt is an example's text.

Must not know: the database, Celery, HTTP, torch (nor genjob itself: it builds plain dicts).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import random
import re
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

TASKS: tuple[str, ...] = ("rewrite", "extract", "summarize", "classify", "write")
EXAMPLE_PACKAGES: tuple[str, ...] = ("click", "rich", "jinja2", "kombu")
HELDOUT_PACKAGES: tuple[str, ...] = ("sqlalchemy", "alembic", "httpx", "celery", "pydantic", "markupsafe")
CLASSIFY_LABELS: tuple[str, ...] = ("parsing", "formatting", "io", "validation", "configuration", "other")

# New tokens per line when the caller gives none: enough for the usual answer of each task.
MAX_TOKENS: dict[str, int] = {"rewrite": 256, "extract": 128, "summarize": 96, "classify": 8, "write": 128}

# The single decoding mode (genjob's --mode) that suits each task, and why (the default, auto, needs none).
MODE_FOR_TASK: dict[str, tuple[str, str]] = {
    "rewrite": ("prompt-lookup", "the answer is the prompt's code again, so long n-gram runs match"),
    "extract": ("prompt-lookup", "names and parameter lists are copied from the source in the prompt"),
    "summarize": ("prompt-lookup", "a summary reuses phrases of the text, though fewer than a rewrite"),
    "classify": ("none", "one or two new tokens: nothing to draft, a proposer only adds its overhead"),
    "write": ("none", "open-ended text not found in the prompt: n-grams rarely match"),
}

SYSTEM_PROMPT = "You are a helpful assistant for Python developers. Follow the instructions exactly."
INSTRUCTIONS: dict[str, str] = {
    "rewrite": (
        "Rewrite this Python function so that every parameter and the return value have type hints "
        "(keep the ones it has). Keep its name, behaviour, comments and docstring unchanged. "
        "Reply with the code only."
    ),
    "extract": (
        'Return a JSON object with keys "name", "parameters" (list of names), "returns" (short string) '
        'and "raises" (list of exception names) for this Python function. Reply with JSON only.'
    ),
    "summarize": "Summarize the following text in two sentences.",
    "classify": (
        "Classify what this Python function mainly does. Answer with exactly one label from: "
        + ", ".join(CLASSIFY_LABELS)
        + "."
    ),
}
WRITE_TOPICS: tuple[str, ...] = (
    'Write a short paragraph for a blog post about this part of the {package} Python library: "{topic}".',
    "Write three practical tips for a Python developer, inspired by this line of the {package} docs: "
    '"{topic}".',
    'Write the opening paragraph of a tutorial for beginners on this {package} feature: "{topic}".',
)

# Worked examples before a classify line's question (written here, from no package): SmolLM2-135M
# answers a bare question with a sentence, and after a single example with that example's label.
CLASSIFY_SHOTS: tuple[tuple[str, str], ...] = (
    ("def read_config(path):\n    with open(path) as f:\n        return json.load(f)", "io"),
    ("def check_port(port):\n    if not 0 < port < 65536:\n        raise ValueError(port)", "validation"),
    ("def money(amount):\n    return f'${amount:,.2f}'", "formatting"),
)

MAX_ID_CHARS = 64
CHARS_PER_TOKEN = 3.5  # a rough estimate for code and English with a BPE tokenizer
MAX_PROMPT_TOKENS = 1500
CODE_LINES = (8, 60)  # a definition's source lines, for rewrite, extract and classify
MAX_LINE_CHARS = 120  # longer lines are generated data or long literals, not code people rewrite
SUMMARY_WORDS = (80, 300)
TOPIC_WORDS = (4, 16)
# Directories never read: test suites, vendored copies of other libraries (pydantic.v1 is pydantic 1).
SKIP_DIRS = frozenset({"__pycache__", "tests", "test", "testing", "_vendor", "vendor", "vendored", "v1"})
_SECTION = re.compile(r"^\s*[A-Z][A-Za-z ]{1,30}:\s*$|^\s*[A-Z][a-z]+$")  # Args:, Parameters
_MARKUP_LINE = re.compile(r"^\s*(:\w|>>>|\.\. |\$ |\||[-=~^*]{4,}$)")


@dataclass(frozen=True, slots=True)
class SourceText:
    """A piece of a package's text: a definition's source, a docstring's prose, or its first sentence.

    ``key`` names where it comes from: ``<package>-<module>-<qualified name>``
    (``click-core-Command.invoke``), the module without the package's name and without ``__init__``
    (``-module`` for a module's own docstring)."""

    key: str
    package: str
    text: str


@dataclass(frozen=True, slots=True)
class PackageTexts:
    functions: tuple[SourceText, ...]  # rewrite, extract, classify
    docstrings: tuple[SourceText, ...]  # summarize
    topics: tuple[SourceText, ...]  # write


def estimate_tokens(text: str) -> int:
    """A rough token count (``CHARS_PER_TOKEN``), the same on every machine."""
    return int(len(text) / CHARS_PER_TOKEN) + 1


def package_files(package: str) -> list[tuple[str, Path]]:
    """(dotted module name within the package, path) of a package's ``.py`` files, sorted, found
    without importing it; test suites and vendored directories (``SKIP_DIRS``) are left out."""
    spec = importlib.machinery.PathFinder.find_spec(package)
    if spec is None or (spec.origin is None and not spec.submodule_search_locations):
        raise ModuleNotFoundError(f"package {package!r} is not installed here")
    if not spec.submodule_search_locations:  # a single-module distribution (six.py)
        assert spec.origin is not None
        return [("", Path(spec.origin))] if spec.origin.endswith(".py") else []
    found: dict[str, Path] = {}
    for location in spec.submodule_search_locations:
        root = Path(location)
        for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
            rel = path.relative_to(root)
            if SKIP_DIRS & set(rel.parts[:-1]) or rel.name.startswith("test_") or rel.name == "conftest.py":
                continue
            parts = [*rel.parts[:-1], rel.stem] if rel.stem != "__init__" else list(rel.parts[:-1])
            found.setdefault(".".join(parts), path)
    return [(module, found[module]) for module in sorted(found)]


def definitions(
    tree: ast.Module,
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]]:
    """(qualified name, node) of the module's functions, classes and their methods, in source order
    (functions nested in functions are part of their parent's source, not definitions of their own)."""

    def walk(
        node: ast.AST, prefix: str
    ) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                yield name, child
                if isinstance(child, ast.ClassDef):
                    yield from walk(child, f"{name}.")

    yield from walk(tree, "")


def definition_source(lines: list[str], node: ast.stmt) -> str:
    """A definition's source from its first decorator to its last line, dedented."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    assert node.end_lineno is not None
    return textwrap.dedent("\n".join(lines[first - 1 : node.end_lineno])).strip("\n")


def is_code_candidate(source: str, node: ast.stmt) -> bool:
    """A function people would ask about: 8–60 plain lines, more than a stub, a whole definition."""
    lines = source.splitlines()
    if not CODE_LINES[0] <= len(lines) <= CODE_LINES[1] or max(map(len, lines)) > MAX_LINE_CHARS:
        return False
    body = [stmt for stmt in getattr(node, "body", []) if not _is_docstring(stmt)]
    if len(body) < 2 and all(isinstance(stmt, ast.Pass | ast.Raise | ast.Expr) for stmt in body):
        return False  # a stub, an abstract method or only a docstring
    try:
        ast.parse(source)
    except SyntaxError:  # a continuation line less indented than the def (dedent left it unparseable)
        return False
    return True


def is_topic_class(node: ast.stmt) -> bool:
    """A public class that is not an exception: its docstring's first sentence is a topic to write on."""
    if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
        return False
    names = [node.name, *(getattr(base, "id", getattr(base, "attr", "")) for base in node.bases)]
    return not any(name.endswith(("Error", "Exception", "Warning", "Exit", "Abort")) for name in names)


def prose_part(doc: str) -> str:
    """A docstring's leading prose: its paragraphs up to the first one that is a section (``Args:``,
    ``:param``), an example (``>>>``, an indented block) or other markup."""
    kept = []
    for paragraph in doc.strip().split("\n\n"):
        lines = paragraph.splitlines()
        if _SECTION.match(lines[0]) or any(
            _MARKUP_LINE.match(line) or line.startswith(" ") for line in lines
        ):
            break
        kept.append(paragraph.strip())
    if kept and kept[-1].endswith(":"):  # it introduced what was cut
        kept.pop()
    return "\n\n".join(kept)


def is_prose(text: str) -> bool:
    """Prose worth summarizing: 80–300 words."""
    return SUMMARY_WORDS[0] <= len(text.split()) <= SUMMARY_WORDS[1]


def docstring_topic(doc: str) -> str | None:
    """A docstring's first sentence as a topic (4–16 words, no markup), without its full stop."""
    paragraph = re.sub(r"\s+", " ", doc.strip().split("\n\n", 1)[0])
    first = re.split(r"(?<=[a-z)])\. ", paragraph, maxsplit=1)[0].removesuffix(".").strip()
    words = first.split()
    if not TOPIC_WORDS[0] <= len(words) <= TOPIC_WORDS[1] or not first[0].isalpha():
        return None
    if any(mark in first for mark in ("`", ":", "|", "*", "{", "(", "<", ">>>", "http", "@")):
        return None
    if first.lower().startswith(("deprecated", "alias", "backwards", "compat", "copyright", "todo")):
        return None
    return first[0].upper() + first[1:]


class _Pool:
    """One package's texts for one use, in the order found: each text once, each key unique (a key
    seen before, as a property's getter and setter, gets ``-2``, ``-3``…)."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.by_text: dict[str, SourceText] = {}
        self.keys: set[str] = set()

    def add(self, key: str, text: str) -> None:
        if text in self.by_text or "\x00" in text:  # Postgres text holds no NUL
            return
        unique, count = key, 1
        while unique in self.keys:
            count += 1
            unique = f"{key}-{count}"
        self.keys.add(unique)
        self.by_text[text] = SourceText(unique, self.package, text)

    def texts(self) -> tuple[SourceText, ...]:
        return tuple(self.by_text.values())


@cache
def package_texts(package: str) -> PackageTexts:
    """Every candidate text of one package, in file and source order."""
    functions, docstrings, topics = _Pool(package), _Pool(package), _Pool(package)
    for module, path in package_files(package):
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        prefix = f"{package}-{module}" if module else package
        documented: list[tuple[str, str | None, bool]] = [(f"{prefix}-module", ast.get_docstring(tree), True)]
        for qualname, node in definitions(tree):
            key = f"{prefix}-{qualname}"
            documented.append((key, ast.get_docstring(node), is_topic_class(node)))
            if not isinstance(node, ast.ClassDef):
                code = definition_source(lines, node)
                if is_code_candidate(code, node):
                    functions.add(key, code)
        for key, doc, gives_topic in documented:
            if not doc:
                continue
            prose = prose_part(doc)
            if is_prose(prose):
                docstrings.add(key, prose)
            topic = docstring_topic(doc) if gives_topic else None
            if topic:
                topics.add(key, topic)
    return PackageTexts(functions.texts(), docstrings.texts(), topics.texts())


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def user_message(task: str, text: SourceText, seed: int = 0) -> str:
    """The user message of one line: the task's instruction and the text."""
    if task == "write":
        template = random.Random(f"{seed}:write:{text.key}").choice(WRITE_TOPICS)
        return template.format(package=text.package, topic=text.text)
    if task == "summarize":
        return f"{INSTRUCTIONS[task]}\n\n{text.text}"
    return f"{INSTRUCTIONS[task]}\n\n```python\n{text.text}\n```"


def chat_messages(task: str, text: SourceText, seed: int = 0) -> list[dict[str, str]]:
    """A line's messages: the system prompt, the worked examples (classify only), the user message."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for code, label in CLASSIFY_SHOTS if task == "classify" else ():
        shot = SourceText("shot", "shot", code)
        messages += [
            {"role": "user", "content": user_message(task, shot)},
            {"role": "assistant", "content": label},
        ]
    return [*messages, {"role": "user", "content": user_message(task, text, seed)}]


def candidates(task: str, package: str) -> tuple[SourceText, ...]:
    """The texts of ``package`` that ``task`` can use, each giving a prompt under ``MAX_PROMPT_TOKENS``."""
    texts = package_texts(package)
    pool = {"summarize": texts.docstrings, "write": texts.topics}.get(task, texts.functions)
    return tuple(text for text in pool if estimate_tokens(user_message(task, text)) <= MAX_PROMPT_TOKENS)


def pick_texts(task: str, packages: Sequence[str], n: int, *, seed: int = 0) -> list[SourceText]:
    """Up to ``n`` texts for ``task``, taken in turn from each package (in the order given) after each
    package's candidates are shuffled by ``random.Random(f"{seed}:{task}:{package}")``."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r} (tasks: {', '.join(TASKS)})")
    queues = []
    for package in packages:
        pool = list(candidates(task, package))
        random.Random(f"{seed}:{task}:{package}").shuffle(pool)
        queues.append(pool)
    picked: list[SourceText] = []
    while len(picked) < n and any(queues):
        for queue in queues:
            if queue and len(picked) < n:
                picked.append(queue.pop(0))
    return picked


def custom_id(task: str, key: str) -> str:
    """``<task>-<key>``, or, past ``MAX_ID_CHARS``, its start and a hash of the whole (still unique)."""
    full = f"{task}-{key}"
    if len(full) <= MAX_ID_CHARS:
        return full
    digest = hashlib.md5(full.encode()).hexdigest()[:8]
    return f"{full[: MAX_ID_CHARS - 9]}~{digest}"


def chat_lines(
    task: str,
    packages: Sequence[str],
    n: int,
    *,
    model: str = "smollm2",
    max_tokens: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Up to ``n`` OpenAI Batch input lines (``/v1/chat/completions``, greedy) for ``task``::

    {"custom_id": "rewrite-click-core-Command.invoke", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "smollm2", "messages": [...], "max_tokens": 256, "temperature": 0}}
    """
    lines = []
    for text in pick_texts(task, packages, n, seed=seed):
        body = {
            "model": model,
            "messages": chat_messages(task, text, seed),
            "max_tokens": max_tokens or MAX_TOKENS[task],
            "temperature": 0,
        }
        lines.append(
            {
                "custom_id": custom_id(task, text.key),
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": body,
            }
        )
    return lines


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """``messages`` as the model's token ids: its chat template with the generation prompt (what a
    worker decodes from a chat line)."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
