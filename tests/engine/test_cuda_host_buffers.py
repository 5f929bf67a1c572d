"""The CUDA backend's page-locked host buffers, with torch's CUDA runtime calls recorded by a stand-in (runs
without a GPU): every registration is undone once, before the memory can return to the C allocator."""

import gc

import pytest
import torch

from superoffload.device.base import Device
from superoffload.device.cuda import CudaDevice


class _Runtime:
    def __init__(self, fail: bool = False) -> None:
        self.registered: set[int] = set()
        self.calls: list[tuple[str, int]] = []
        self.fail = fail
        self.errors_read = 0

    def cudaHostRegister(self, ptr: int, nbytes: int, flags: int) -> int:  # noqa: N802 - the runtime's name
        self.calls.append(("register", ptr))
        if self.fail or ptr in self.registered:
            return 712   # cudaErrorHostMemoryAlreadyRegistered
        self.registered.add(ptr)
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        self.calls.append(("unregister", ptr))
        self.registered.remove(ptr)   # KeyError: unregistered twice, or never registered
        return 0

    def cudaGetLastError(self) -> int:  # noqa: N802
        self.errors_read += 1
        return 0


@pytest.fixture
def runtime(monkeypatch):
    rt = _Runtime()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: rt)
    return rt


def _device() -> CudaDevice:
    dev = CudaDevice.__new__(CudaDevice)   # no GPU here: the host-buffer half of the backend only
    Device.__init__(dev, torch.device("cpu"), 1 << 30)
    dev._registered = {}
    return dev


def test_freed_buffers_are_unregistered_once(runtime):
    dev = _device()
    buf = dev.host_buffer(4096, True, "transfer")
    ptr = buf.data_ptr()
    assert runtime.registered == {ptr}
    dev.free_host_buffer(buf, True, "transfer")
    assert runtime.registered == set() and dev._registered == {}
    del buf
    gc.collect()
    assert runtime.calls == [("register", ptr), ("unregister", ptr)]
    assert dev.memory_report()["host_needed_bytes"]["pinned"] == 0


def test_a_buffer_dropped_without_free_is_unregistered_when_its_last_view_dies(runtime):
    """An engine dropped without close(): the registration goes with the memory, not with the tensor object
    that host_buffer returned (callers keep only a typed view of it, weight flow's frozen stores do)."""
    dev = _device()
    buf = dev.host_buffer(4096, True, "transfer")
    ptr = buf.data_ptr()
    view = buf.view(torch.float32)[:10]
    del buf
    gc.collect()
    assert runtime.registered == {ptr}   # still in use through the view: still page-locked
    view.fill_(1.0)
    del view
    gc.collect()
    assert runtime.registered == set() and dev._registered == {}


def test_a_failed_registration_falls_back_and_reads_the_error_off(monkeypatch):
    rt = _Runtime(fail=True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: rt)
    monkeypatch.setattr(torch, "empty", _no_pin(torch.empty))
    dev = _device()
    buf = dev.host_buffer(3000, True, "transfer")
    assert rt.errors_read == 1 and dev._registered == {}
    assert buf.numel() == 3000
    assert dev.memory_report()["host_allocated_bytes"]["pinned"] == 4096   # the caching allocator's pow2 block


def _no_pin(empty):
    """torch.empty without pin_memory (pinning needs a GPU): the fallback path's allocation, here."""
    def call(*args, pin_memory=False, **kwargs):
        return empty(*args, **kwargs)
    return call
