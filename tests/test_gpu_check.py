"""scripts/gpu_check.py keeps working where it is meant to run: a bare python with torch and transformers.

The GPU machine it is for has its own ``python3`` with torch and transformers preinstalled and nothing
else, and no network. Here that is: the base interpreter under this venv, started with ``-S`` (no
site-packages at all, neither its own nor the venv's) and ``PYTHONPATH`` a folder of links to exactly
the distributions torch and transformers require (their ``Requires-Dist`` closure, extras left out, read
from this venv's metadata). genjob comes from the source tree only, through the script's own mapping.
The quick check (tiny shapes, a CPU) must finish and write every section; where genjob's base
dependencies are missing (sqlalchemy, …) the embedded job is skipped with a line, and with them (this
venv) that job runs end to end on SQLite.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
SECTIONS = {"env", "engine", "dtypes", "memory", "oom", "embedded"}


def requirement_closure(names: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions ``names`` need, recursively (requirements under an extra left out)."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:  # a requirement for another platform or python
            continue
        found[key] = dist
        for requirement in dist.requires or []:
            if "extra ==" not in requirement:
                match = re.match(r"[A-Za-z0-9_.-]+", requirement)
                assert match is not None, requirement
                todo.append(match.group(0))
    return found


def bare_site(folder: Path) -> Path:
    """Links to the modules (and metadata) of torch's and transformers' closure, and nothing else."""
    folder.mkdir()
    for dist in requirement_closure(["torch", "transformers"]).values():
        for file in dist.files or []:
            top = file.parts[0]
            if top in {"..", "__pycache__"} or top.endswith((".data", ".pth")):  # metadata is kept
                continue
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (folder / top).exists():
                (folder / top).symlink_to(source)
    return folder


def base_python() -> str:
    """The interpreter this venv was made from (its site-packages are off with -S)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return str(Path(sys.base_prefix) / "bin" / f"python{version}")


@pytest.fixture
def bare(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    env = {key: value for key, value in os.environ.items() if key not in {"PYTHONHOME", "VIRTUAL_ENV"}}
    env = {key: value for key, value in env.items() if not key.startswith("GENJOB_")}
    env["PYTHONPATH"] = str(bare_site(tmp_path / "site"))
    return [base_python(), "-S"], env


def run_check(
    python: list[str], env: dict[str, str], out: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    command = [*python, str(SCRIPT), "--device", "cpu", "--quick", "--out", str(out), *extra]
    return subprocess.run(command, cwd=out.parent, env=env, capture_output=True, text=True, timeout=600)


def test_the_bare_python_has_torch_and_transformers_and_not_genjobs_dependencies(bare) -> None:
    python, env = bare
    probe = "import torch, transformers; print(torch.__version__)"
    assert subprocess.run([*python, "-c", probe], env=env, capture_output=True, timeout=120).returncode == 0
    for module in ("sqlalchemy", "alembic", "pydantic_settings", "celery", "redis", "genjob"):
        probe = f"import {module}"
        result = subprocess.run([*python, "-c", probe], env=env, cwd="/", capture_output=True, timeout=60)
        assert result.returncode != 0, f"{module} is importable in the bare python"


def test_quick_check_on_a_bare_python_writes_every_section(bare, tmp_path: Path) -> None:
    python, env = bare
    out = tmp_path / "report.json"
    result = run_check(python, env, out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("| section | case | B |"), result.stdout[:500]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report.keys() >= SECTIONS
    failed = {name: report[name]["failed"] for name in SECTIONS if "failed" in report[name]}
    assert not failed, failed
    assert report["env"]["torch"] and report["env"]["sdpa_bool_mask_bf16"]
    for model in ("tiny 1B-like", "tiny 8B-like"):
        for batch in ("1", "8"):
            runs = report["engine"][model][batch]
            assert {"plain", "prompt lookup", "hf generate"} <= runs.keys()
            fixed = [mode for mode in runs if mode.startswith("fixed γ")]
            assert fixed and all(0 < runs[mode]["alpha"] <= 1 for mode in fixed)
            assert all(runs[mode]["tps"] > 0 for mode in runs)
    assert len(report["dtypes"]) == 4 and all(case["rows"] == 4 for case in report["dtypes"].values())
    assert len(report["memory"]["readings"]) == 4
    oom = report["oom"]
    assert oom["oom_events"] == 1 and oom["finished"] == oom["rows"] == oom["same_as_without"]
    skipped = report["embedded"]["skipped"]  # a dependency of genjob's, never genjob itself
    assert "No module named" in skipped and "genjob" not in skipped, skipped
    assert "| embedded | a job on SQLite |" in result.stdout


def test_embedded_job_runs_end_to_end_where_genjobs_dependencies_are_there(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GENJOB_")}
    out = tmp_path / "report.json"
    result = run_check([sys.executable], env, out, "--sections", "embedded")
    assert result.returncode == 0, result.stderr[-3000:]
    embedded = json.loads(out.read_text(encoding="utf-8"))["embedded"]
    assert embedded["exit"] == 0, embedded
    assert embedded["stats"]["done"] == embedded["stats"]["total"] == 4
