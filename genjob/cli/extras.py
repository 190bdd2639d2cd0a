"""The extras a command needs beyond the base install: one line naming the one to install, not a traceback.

``pip install genjob`` is the core and the CLI that submits; ``genjob api`` needs ``genjob[api]`` and
``genjob worker`` / ``genjob calibrate`` need ``genjob[worker]`` (pyproject's optional dependencies).
``require_extra`` checks the extra's modules are there without importing them (the worker imports
torch only in its pool processes); ``needs_extra`` turns a ModuleNotFoundError of anything but genjob
itself, met while the command imports what it runs, into the same line. Both exit 1 (ClickException).
Must not know: the API, the workers (it only names their modules).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

import click

# The modules each extra brings that its commands import (import names, not distribution names).
EXTRA_MODULES = {
    "api": ("fastapi", "granian", "multipart", "transformers", "jinja2"),
    "worker": ("torch", "transformers", "safetensors", "accelerate"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_extra(extra: str, command: str, module: str) -> click.ClickException:
    return click.ClickException(
        f"`genjob {command}` needs the '{extra}' extra ({module} is not installed): "
        f"pip install 'genjob[{extra}]'"
    )


def require_extra(extra: str, command: str) -> None:
    """Exit 1 with one line if a module of ``extra`` is not installed."""
    for module in EXTRA_MODULES[extra]:
        if not _installed(module):
            raise missing_extra(extra, command, module)


@contextmanager
def needs_extra(extra: str, command: str) -> Iterator[None]:
    """A module missing while the block imports (not genjob's own) is the extra's: one line, exit 1."""
    try:
        yield
    except ModuleNotFoundError as exc:
        name = (exc.name or "").split(".", 1)[0]
        if not name or name == "genjob":
            raise
        raise missing_extra(extra, command, name) from exc
