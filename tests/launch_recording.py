"""A stand-in for the compiler and the launch, shared by the CPU tests of what `forward` and
`forward_varlen` hand each kernel: the `launches` fixture records (key, arguments) of every
launch instead of compiling and running, with the GPU's arch (sm_90a) and SM count (132)
stood in; `named_arguments` names a launch's arguments by its backend's registered list."""

import pytest
import torch

from cute_fa import compiler, interface
from cute_fa.backends import backend_of


@pytest.fixture
def launches(monkeypatch):
    held = (torch.empty(1, 1, 1), torch.zeros(1, dtype=torch.int32),
            torch.zeros(1, 1, dtype=torch.int32))
    recorded = []
    monkeypatch.setattr(interface, "_check_device", lambda *a: None)
    monkeypatch.setattr(interface, "_arch", lambda device_index: "sm_90a")
    monkeypatch.setattr(interface, "_num_sms", lambda device_index: 132)
    monkeypatch.setattr(interface, "get_kernel", lambda key: key)
    monkeypatch.setattr(interface, "_placeholders", lambda device_index: held)
    monkeypatch.setattr(interface, "_launch",
                        lambda device_index, kernel, args: recorded.append((kernel, args)))
    compiler.memory_cache.clear()
    yield recorded, held
    compiler.memory_cache.clear()


def named_arguments(key, args) -> dict:
    names = [name for name, _ in backend_of(key).arguments]
    assert len(args) == len(names), (key, len(args), names)
    return dict(zip(names, args))
