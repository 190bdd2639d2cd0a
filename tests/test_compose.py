"""compose.yaml and its Dockerfile, checked without a Docker engine: the services, their health
checks (the workers' and Flower's one-liners run against a local server) and start order, the GPU
reservations of the two workers and their metrics ports, the caches on volumes, and commands that
the genjob CLI really has."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from click.testing import CliRunner

from genjob.cli import main
from genjob.settings import Settings
from genjob.worker.stop_deadline import STOP_MARGIN_S

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
WORKERS = ("worker", "worker-gpu1")
GENJOB_SERVICES = ("migrate", "api", *WORKERS, "flower")


def test_the_services() -> None:
    assert set(SERVICES) == {"redis", "postgres", "migrate", "api", *WORKERS, "flower"}


@pytest.mark.parametrize("name", ["redis", "postgres", "api", *WORKERS, "flower"])
def test_health_checks(name: str) -> None:
    check = SERVICES[name]["healthcheck"]
    assert check["test"][0] in ("CMD", "CMD-SHELL") and len(check["test"]) > 1
    assert check["interval"] and check["retries"] >= 3


def test_start_order() -> None:
    def conditions(name: str) -> dict[str, str]:
        return {dep: spec["condition"] for dep, spec in SERVICES[name]["depends_on"].items()}

    assert conditions("migrate") == {"postgres": "service_healthy"}
    for name in ("api", *WORKERS):
        assert conditions(name) == {"migrate": "service_completed_successfully", "redis": "service_healthy"}
    assert conditions("flower") == {"redis": "service_healthy"}
    assert SERVICES["migrate"]["restart"] == "no"


def test_migrate_upgrades_to_head() -> None:
    assert SERVICES["migrate"]["command"] == ["genjob", "db", "upgrade"]


@pytest.mark.parametrize("name", WORKERS)
def test_each_worker_reserves_one_gpu_and_consumes_the_gpu_queue(name: str) -> None:
    worker = SERVICES[name]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["capabilities"] == ["gpu"]
    assert len(device.get("device_ids", [])) == 1 or device.get("count") == 1
    command = worker["command"]
    assert command[command.index("-Q") + 1] == "gpu"
    assert command[command.index("-c") + 1] == "1"
    assert worker["environment"]["GENJOB_DEVICE"] == "cuda"


def test_the_two_workers_use_their_own_gpu_name_and_metrics_port() -> None:
    def device_ids(name: str) -> list[str]:
        return SERVICES[name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]

    def node(name: str) -> str:
        command = SERVICES[name]["command"]
        return command[command.index("-n") + 1]

    assert [device_ids(name) for name in WORKERS] == [["0"], ["1"]]
    assert node("worker") != node("worker-gpu1")
    ports = []
    for name in WORKERS:
        port = SERVICES[name]["environment"]["GENJOB_METRICS_PORT"]
        # published where the worker serves it, on the host's loopback only: the metrics have no auth
        assert SERVICES[name]["ports"] == [f"127.0.0.1:{port}:{port}"]
        ports.append(port)
    assert len(set(ports)) == 2
    # a host with one GPU starts without the second (`--profile gpu1` adds it)
    assert "profiles" not in SERVICES["worker"] and SERVICES["worker-gpu1"]["profiles"] == ["gpu1"]


@pytest.mark.parametrize("name", WORKERS)
def test_a_worker_stops_well_within_compose_grace(name: str) -> None:
    """On SIGTERM a worker is gone by GENJOB_STOP_GRACE_S + the margin: before compose's SIGKILL."""
    grace = SERVICES[name]["stop_grace_period"]
    seconds = int(grace[:-1]) * {"s": 1, "m": 60}[grace[-1]]
    stop_grace_s = float(SERVICES[name]["environment"].get("GENJOB_STOP_GRACE_S", Settings().stop_grace_s))
    assert seconds >= 2 * (stop_grace_s + STOP_MARGIN_S)


@pytest.mark.parametrize("name", WORKERS)
def test_the_workers_caches_are_on_named_volumes(name: str) -> None:
    service, declared = SERVICES[name], set(COMPOSE["volumes"])
    mounts = {target: source for source, target, *_ in (v.split(":") for v in service["volumes"])}
    env = service["environment"]
    for directory in (env["GENJOB_COST_CACHE_DIR"], env["HF_HOME"]):
        assert mounts[directory] in declared, directory  # a named volume, not the container's disk
    dockerfile = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    made = next(line for line in dockerfile.splitlines() if "mkdir -p" in line)
    assert env["GENJOB_COST_CACHE_DIR"] in made and env["HF_HOME"] in made  # owned by the user genjob


class _Answering(BaseHTTPRequestHandler):
    status = 200
    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.paths.append(self.path)
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def local_server() -> Iterator[tuple[int, type[_Answering]]]:
    handler = type("Handler", (_Answering,), {"paths": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], handler
    server.shutdown()
    server.server_close()


def run_check(test: list[str], **env: str) -> int:
    assert test[:2] == ["CMD", "python"]  # the image's python: no curl needed
    done = subprocess.run(
        [sys.executable, *test[2:]], env={**os.environ, **env}, capture_output=True, timeout=30
    )
    return done.returncode


@pytest.mark.parametrize("name", WORKERS)
def test_a_worker_health_check_asks_its_healthz_and_fails_on_503(name: str, local_server) -> None:
    port, handler = local_server
    test = SERVICES[name]["healthcheck"]["test"]
    assert run_check(test, GENJOB_METRICS_PORT=str(port)) == 0
    handler.status = 503  # a pool process holds a chunk with no round for longer than its bound
    assert run_check(test, GENJOB_METRICS_PORT=str(port)) != 0
    assert handler.paths == ["/healthz", "/healthz"]


def test_the_flower_health_check_asks_its_healthcheck(local_server) -> None:
    port, handler = local_server
    test = [part.replace(":5555/", f":{port}/") for part in SERVICES["flower"]["healthcheck"]["test"]]
    assert run_check(test) == 0
    assert handler.paths == ["/healthcheck"]
    assert "http://127.0.0.1:5555/healthcheck" in " ".join(SERVICES["flower"]["healthcheck"]["test"])


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
    assert SERVICES["api"]["environment"]["GENJOB_ADMIN_API_KEYS"] == "${GENJOB_ADMIN_API_KEYS:-}"
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
