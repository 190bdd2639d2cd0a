"""The repository root on ``sys.path``, so that a benchmark run as ``python bench/x.py`` imports what the
tests use (``tests.support``): ``from repo_root import ROOT`` before any ``from tests.support… import``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
