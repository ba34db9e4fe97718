"""A stand-in for the compiler and the launch, shared by the CPU tests of what the public
functions hand each kernel: the `launches` fixture records (key, arguments) of every launch
instead of compiling and running, with a GPU of arch sm_90a and 132 SMs stood in for the CPU
tensors' device (and CPU tensors for a persistent wgmma kernel's tile counter and a one-launch
split-KV call's counters); `named_arguments` names a launch's arguments by its backend's
registered list."""

import pytest
import torch

from cute_fa.api import checks
from cute_fa.compile.registry import backend_of
from cute_fa.runtime import device, plan, run


@pytest.fixture
def launches(monkeypatch):
    no_lse = torch.empty(1, 1, 1)
    counter = torch.zeros(1, dtype=torch.int32)
    recorded = []
    monkeypatch.setattr(checks, "check_devices", lambda named, device_index: None)
    monkeypatch.setitem(device.DEVICES, -1, device.stand_in("sm_90a", 132))
    monkeypatch.setattr(plan, "get_kernel", lambda key: key)
    monkeypatch.setattr(run, "no_lse", lambda device_index: no_lse)
    monkeypatch.setattr(run, "tile_counter", lambda device_index: counter)
    monkeypatch.setattr(run, "split_counters",
                        lambda device_index, count: torch.zeros(count, dtype=torch.int32))
    monkeypatch.setattr(run, "launch",
                        lambda device_index, kernel, args: recorded.append((kernel, args)))
    plan.clear_plans()
    yield recorded, no_lse
    plan.clear_plans()


def named_arguments(key, args) -> dict:
    names = [a.name for a in backend_of(key).arguments]
    assert len(args) == len(names), (key, len(args), names)
    return dict(zip(names, args))


@pytest.fixture
def kernels_asked(launches, monkeypatch):
    """The keys calls and `precompile` ask the compiler for, in order (nothing compiles)."""
    from cute_fa.api import precompile

    keys = []
    monkeypatch.setattr(plan, "get_kernel", lambda key: keys.append(key) or key)
    monkeypatch.setattr(precompile, "get_kernel", lambda key: keys.append(key) or key)
    monkeypatch.setattr(precompile, "wait_for_saves", lambda: None)
    return keys


@pytest.fixture
def cpu_ops():
    """The in-graph mods' custom ops (`api.graph_mods`) with their bodies as CPU kernels too
    (for the rest of the process: no test expects them to refuse the CPU), so that a compiled
    graph runs them here, the launch stood in by `launches`."""
    from cute_fa.api import graph_mods

    for op in (graph_mods.fwd_mods, graph_mods.bwd_mods):
        op.register_kernel("cpu")(op._init_fn)
