"""The GPU facts a plan reads (arch, SM count), read once per device, and the launch.

`device(index)` asks torch about a real GPU; `stand_in(arch)` is a device of that arch that
exists nowhere, for planning on a machine without a GPU (precompile, the CPU tests).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..arch import Arch


class Device(NamedTuple):
    index: int
    arch: str  # as the DSL targets it: 'sm_80', 'sm_90a', ...
    num_sms: int


# SMs of the largest part of each arch, for a stand-in device's grid decisions
TYPICAL_SMS = {"sm_80": 108, "sm_86": 84, "sm_87": 16, "sm_89": 128, "sm_90a": 132,
               "sm_100a": 148, "sm_120a": 170}

# the facts read so far, by device index (the CPU tests put stand-ins here)
DEVICES: dict = {}


def device(index: int) -> Device:
    """The facts of cuda:index, read once."""
    found = DEVICES.get(index)
    if found is None:
        if not torch.cuda.is_available():
            raise RuntimeError("cute_fa's kernels need a CUDA GPU, and torch sees none here "
                               "(torch.cuda.is_available() is False)")
        major, minor = torch.cuda.get_device_capability(index)
        if major < 8:
            raise RuntimeError(f"cute_fa needs an sm80 or newer GPU, cuda:{index} is "
                               f"sm{major}{minor}")
        props = torch.cuda.get_device_properties(index)
        found = DEVICES[index] = Device(index, Arch(major, minor).name,
                                         props.multi_processor_count)
    return found


def stand_in(arch: str, num_sms: int | None = None) -> Device:
    """A device of `arch` (any spelling `Arch.parse` takes) that no GPU backs: what `plan`
    decides for such a GPU, on any machine."""
    name = Arch.parse(arch).name
    return Device(-1, name, num_sms if num_sms is not None else TYPICAL_SMS.get(name, 132))


_GPU_COUNT: list = []


def launch(device_index: int, kernel, args: tuple) -> None:
    """`kernel(*args)` on the current stream of cuda:device_index."""
    if not _GPU_COUNT:
        _GPU_COUNT.append(torch.cuda.device_count())
    if _GPU_COUNT[0] == 1 or device_index == torch.cuda.current_device():
        kernel(*args)
    else:
        with torch.cuda.device(device_index):
            kernel(*args)


_NO_LSE: dict = {}
_TILE_COUNTERS: dict = {}


def tile_counter(device_index: int) -> torch.Tensor:
    """The tile counter of a persistent wgmma forward whose CTAs take tiles as they finish
    (`Sm90Key.dynamic_tiles`), on the current stream of cuda:device_index: one int32, zero
    between launches (a launch's last fetch puts it back), so the launches queued on a stream
    take it in turn; each stream has its own."""
    stream = torch.cuda.current_stream(device_index).cuda_stream
    held = _TILE_COUNTERS.get((device_index, stream))
    if held is None:
        held = _TILE_COUNTERS[(device_index, stream)] = torch.zeros(
            1, device=f"cuda:{device_index}", dtype=torch.int32)
    return held


_SPLIT_COUNTERS: dict = {}


def split_counters(device_index: int, count: int) -> torch.Tensor:
    """At least `count` int32 counters of a one-launch split-KV call (`Sm80Key.fused_merge`),
    one per query block, on the current stream of cuda:device_index: zero between launches
    (each block's last CTA puts its counter back), so the launches queued on a stream take
    them in turn; each stream has its own. Grown by doubling; a replaced buffer is freed in
    stream order, after the launches queued before."""
    stream = torch.cuda.current_stream(device_index).cuda_stream
    held = _SPLIT_COUNTERS.get((device_index, stream))
    if held is None or held.numel() < count:
        size = max(count, 2 * held.numel() if held is not None else 1024)
        held = _SPLIT_COUNTERS[(device_index, stream)] = torch.zeros(
            size, device=f"cuda:{device_index}", dtype=torch.int32)
    return held


def no_lse(device_index: int) -> torch.Tensor:
    """The LSE tensor of a launch that returns none (write_lse = 0: never written)."""
    held = _NO_LSE.get(device_index)
    if held is None:
        held = _NO_LSE[device_index] = torch.empty((1, 1, 1), device=f"cuda:{device_index}",
                                                   dtype=torch.float32)
    return held
