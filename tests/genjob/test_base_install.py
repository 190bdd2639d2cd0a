"""A base install (`pip install genjob`, no extras): `genjob api` and `genjob worker` say in one line which
extra to install and exit 1, no ModuleNotFoundError traceback. The extras' modules are hidden from a
subprocess by an import hook, as if they had never been installed."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from genjob.cli.extras import needs_extra

ROOT = Path(__file__).resolve().parents[2]

# Runs the CLI with these top-level modules made unimportable (a finder ahead of every other).
HIDING = """
import sys

class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

HIDDEN = set(sys.argv[1].split(","))
sys.meta_path.insert(0, Hide())
sys.argv = ["genjob", *sys.argv[2:]]
from genjob.cli import main
main()
"""


def genjob_without(hidden: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GENJOB_")}
    env["GENJOB_BROKER_URL"] = "redis://127.0.0.1:6379/15"
    return subprocess.run(
        [sys.executable, "-c", HIDING, ",".join(hidden), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("command", "hidden", "extra"),
    [
        ("api", ["fastapi", "granian", "multipart"], "api"),
        ("api", ["granian"], "api"),
        ("worker", ["torch"], "worker"),
        ("calibrate", ["torch", "accelerate"], "worker"),
    ],
)
def test_a_missing_extra_is_one_line(command: str, hidden: list[str], extra: str) -> None:
    args = [command, "-m", "smollm2"] if command == "calibrate" else [command]
    done = genjob_without(hidden, *args)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"Error: `genjob {command}` needs the '{extra}' extra (")
    assert lines[0].endswith(f"is not installed): pip install 'genjob[{extra}]'")


def test_a_module_missing_on_import_names_the_extra() -> None:
    wanted = r"\(pyarrow is not installed\): pip install 'genjob\[api\]'"
    with pytest.raises(click.ClickException, match=wanted), needs_extra("api", "api"):
        raise ModuleNotFoundError("No module named 'pyarrow.parquet'", name="pyarrow.parquet")
    # genjob's own modules missing are a bug, not an extra
    with pytest.raises(ModuleNotFoundError), needs_extra("api", "api"):
        raise ModuleNotFoundError("No module named 'genjob.nope'", name="genjob.nope")


def test_extras_stop_at_the_tested_versions() -> None:
    """Each extra's range ends at (``<=``) the version constraints.txt pins, the one CI tests: a wheel
    install gets no newer one than was tested."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, pinned = line.split("==", 1)
            pins[canonicalize_name(name)] = pinned.strip()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, requirements in extras.items():
        for text in requirements:
            requirement = Requirement(text)
            if requirement.name == "genjob":
                continue
            pinned = pins[canonicalize_name(requirement.name)]
            upper = {spec.version for spec in requirement.specifier if spec.operator in ("<=", "==")}
            assert upper == {pinned}, f"{extra}: {text} (constraints.txt: {pinned})"
