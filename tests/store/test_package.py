"""The store package's names, imported from their module on first use (PEP 562): the same objects as
the eager imports gave, the same names mypy sees, and nothing loaded before it is asked for."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from genjob import store


def test_every_name_is_typed_exported_and_its_modules_own() -> None:
    typed = store._homes()  # the ``if TYPE_CHECKING:`` block's names, read from the package's source
    assert len(typed) > 40 and "get_job" in typed and "finish_and_claim" in typed
    assert sorted(typed) == store.__all__ == sorted(store._HOME)
    for name, module in typed.items():
        assert store._HOME[name] == module
        assert getattr(store, name) is getattr(importlib.import_module(f"genjob.store.{module}"), name)
        assert name in dir(store)


def test_modules_and_unknown_names() -> None:
    from genjob.store import leases  # a module, as ever

    assert leases is importlib.import_module("genjob.store.leases")
    assert store.queued.PAGE_SIZE > 0  # store.MODULE imports it
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        _ = store.nope
    with pytest.raises(ImportError, match="cannot import name 'nope'"):
        from genjob.store import nope  # noqa: F401


def test_importing_the_package_loads_no_module_of_it() -> None:
    code = (
        "import sys\nfrom genjob import store\n"
        "before = [m for m in sys.modules if m.startswith('genjob.store.')]\n"
        "store.get_job\n"
        "print(before, 'psycopg' in sys.modules, 'genjob.store.chunks' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == "[] False False\n"
