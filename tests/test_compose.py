"""compose.yaml and its Dockerfile, checked without a Docker engine: the services, their health
checks and start order, the GPU reservation, and commands that the genjob CLI really has."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from genjob.cli import main
from genjob.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
GENJOB_SERVICES = ("migrate", "api", "worker", "flower")


def test_the_services() -> None:
    assert set(SERVICES) == {"redis", "postgres", "migrate", "api", "worker", "flower"}


@pytest.mark.parametrize("name", ["redis", "postgres", "api"])
def test_health_checks(name: str) -> None:
    check = SERVICES[name]["healthcheck"]
    assert check["test"][0] in ("CMD", "CMD-SHELL") and len(check["test"]) > 1
    assert check["interval"] and check["retries"] >= 3


def test_start_order() -> None:
    def conditions(name: str) -> dict[str, str]:
        return {dep: spec["condition"] for dep, spec in SERVICES[name]["depends_on"].items()}

    assert conditions("migrate") == {"postgres": "service_healthy"}
    for name in ("api", "worker"):
        assert conditions(name) == {"migrate": "service_completed_successfully", "redis": "service_healthy"}
    assert conditions("flower") == {"redis": "service_healthy"}
    assert SERVICES["migrate"]["restart"] == "no"


def test_migrate_upgrades_to_head() -> None:
    assert SERVICES["migrate"]["command"] == ["genjob", "db", "upgrade"]


def test_the_worker_reserves_one_gpu_and_consumes_the_gpu_queue() -> None:
    worker = SERVICES["worker"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["capabilities"] == ["gpu"]
    assert len(device.get("device_ids", [])) == 1 or device.get("count") == 1
    command = worker["command"]
    assert command[command.index("-Q") + 1] == "gpu"
    assert command[command.index("-c") + 1] == "1"
    assert worker["environment"]["GENJOB_DEVICE"] == "cuda"


@pytest.mark.parametrize("name", GENJOB_SERVICES)
def test_genjob_services_share_one_image_database_and_broker(name: str) -> None:
    service = SERVICES[name]
    assert service["build"] == "." and service["image"] == "genjob:latest"
    env = service["environment"]
    assert env["GENJOB_DATABASE_URL"].startswith("postgresql+psycopg://genjob:")
    assert "@postgres:5432/genjob" in env["GENJOB_DATABASE_URL"]
    assert env["GENJOB_BROKER_URL"] == "redis://redis:6379/0"
    assert env["GENJOB_QUEUE"] == "gpu"
    models = Settings(models=env["GENJOB_MODELS"]).models  # the allow-list parses
    assert [m.name for m in models] == ["demo"]


@pytest.mark.parametrize("name", GENJOB_SERVICES)
def test_every_command_is_a_genjob_command(name: str) -> None:
    command = SERVICES[name]["command"]
    assert command[0] == "genjob"
    result = CliRunner().invoke(main, [*command[1:], "--help"], prog_name="genjob")  # unknown ones fail
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: genjob {command[1]}")


def test_public_services_require_their_secrets() -> None:
    assert SERVICES["api"]["environment"]["GENJOB_API_KEYS"].startswith("${GENJOB_API_KEYS:?")
    assert SERVICES["flower"]["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")
    assert SERVICES["api"]["command"][SERVICES["api"]["command"].index("--host") + 1] == "0.0.0.0"


def test_the_api_health_check_hits_healthz() -> None:
    assert "http://127.0.0.1:8000/healthz" in " ".join(SERVICES["api"]["healthcheck"]["test"])


def test_the_dockerfile_installs_torch_then_the_package() -> None:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")  # join continued lines
    lines = [line.strip() for line in text.splitlines() if not line.startswith("#")]
    runs = [shlex.split(line[4:]) for line in lines if line.startswith("RUN ")]
    installs = [run for run in runs if run[:2] == ["pip", "install"]]
    assert installs[0][2].startswith("torch==")
    assert installs[-1] == ["pip", "install", "--constraint", "constraints.txt", ".[worker,api]"]  # not -e
    copied = {name for line in lines if line.startswith("COPY ") for name in line.split()[1:-1]}
    assert {
        "genjob",
        "worker",
        "api",
        "generation",
        "migrations",
        "pyproject.toml",
        "constraints.txt",
    } <= copied
    assert json.loads(lines[-1].removeprefix("CMD "))[0] == "genjob"
