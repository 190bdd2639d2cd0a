"""One device per pool process, and the device errors after which a pool process exits
(``genjob.worker.devices``), on the CPU: the GPUs a probe saw and a pool child's index are injected;
the exit itself runs on a real worker in tests/integration/test_device_faults.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from billiard.process import current_process
from click.testing import CliRunner

from genjob.cli import main
from genjob.generation.loading import resolve_device
from genjob.settings import Settings
from genjob.worker import device_probe
from genjob.worker.chunks import WorkerFault
from genjob.worker.devices import TooManyProcesses, is_sticky_device_error, pool_devices, take_pool_device

ILLEGAL_ADDRESS = "CUDA error: an illegal memory access was encountered"
DEVICE_ASSERT = "CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA` to enable …"


@pytest.mark.parametrize(
    ("device", "concurrency", "gpus", "devices"),
    [
        ("cuda", 2, 2, ["cuda:0", "cuda:1"]),
        ("auto", 3, 4, ["cuda:0", "cuda:1", "cuda:2"]),
        ("auto", 2, 0, ["cpu", "cpu"]),
        ("cpu", 3, 8, ["cpu", "cpu", "cpu"]),
        ("cuda:1", 1, 2, ["cuda:1"]),
    ],
)
def test_each_pool_process_gets_its_own_gpu(
    device: str, concurrency: int, gpus: int, devices: list[str]
) -> None:
    assert pool_devices(device, concurrency, gpus) == devices


def test_more_pool_processes_than_gpus_are_refused_in_one_line() -> None:
    with pytest.raises(TooManyProcesses) as caught:
        pool_devices("auto", 3, 2)
    assert str(caught.value) == (
        "-c 3 asks for one pool process per GPU, and this machine has 2: use -c 2 or fewer "
        "(or one worker per GPU)"
    )
    with pytest.raises(TooManyProcesses, match="GENJOB_DEVICE=cuda:1 names one GPU: -c 2 would put 2"):
        pool_devices("cuda:1", 2, 2)


def test_genjob_worker_refuses_more_processes_than_the_gpus_its_probe_saw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GENJOB_BROKER_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("GENJOB_DEVICE", "cuda")
    monkeypatch.setattr(device_probe, "probe_device", lambda device: device_probe.Probed("cuda:0", 1, 2))
    result = CliRunner().invoke(main, ["worker", "-c", "3"])
    assert (result.exit_code, result.output) == (
        1,
        "Error: worker not started: -c 3 asks for one pool process per GPU, and this machine has 2: "
        "use -c 2 or fewer (or one worker per GPU)\n",
    )


def test_a_pool_child_takes_the_device_of_its_index_into_its_own_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings(device="cuda", broker_url="redis://127.0.0.1:6379/0", queue="gpu")
    app = SimpleNamespace(genjob_settings=settings, genjob_pool_devices=["cuda:0", "cuda:1"])
    monkeypatch.setattr(current_process(), "index", 1, raising=False)  # billiard's, in the second child
    assert take_pool_device(app) == "cuda:1"
    assert app.genjob_settings.device == "cuda:1"
    assert app.genjob_settings.model_copy(update={"device": "cuda"}) == settings  # nothing else changed
    assert resolve_device(app.genjob_settings.device) == torch.device("cuda", 1)  # what loading gets
    plain = SimpleNamespace(genjob_settings=settings)  # started without a plan (`celery worker` itself)
    assert take_pool_device(plain) is None and plain.genjob_settings is settings


def raised_from(cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise RuntimeError("a batch failed") from inner
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize(
    ("exc", "sticky"),
    [
        (RuntimeError(ILLEGAL_ADDRESS), True),
        (RuntimeError(DEVICE_ASSERT), True),
        (torch.AcceleratorError(ILLEGAL_ADDRESS), True),
        (RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, …)`"), True),
        (raised_from(RuntimeError(ILLEGAL_ADDRESS)), True),  # under another exception
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),  # the batch halves
        (RuntimeError("CUDA error: out of memory"), False),
        (RuntimeError("shape '[4, -1]' is invalid for input of size 6"), False),  # a bug: the batch's fault
        (ValueError("prompt too long"), False),
    ],
)
def test_sticky_device_errors_are_told_from_other_faults(exc: BaseException, sticky: bool) -> None:
    assert is_sticky_device_error(exc) is sticky


def test_a_worker_fault_says_whether_its_process_must_exit() -> None:
    assert WorkerFault("job j: RuntimeError: x", sticky=True).sticky
    assert not WorkerFault("job j: RuntimeError: x").sticky
