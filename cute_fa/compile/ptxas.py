"""ptxas resource counts (registers, spills, shared memory) of compiled PTX, for the compile
tests' resource checks: a pinned ptxas from NVIDIA's nvidia-cuda-nvcc wheel, so that every
machine counts the same."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path


def ptxas_path() -> str:
    """The ptxas that resource checks run: $CUTE_FA_PTXAS, else the one in NVIDIA's
    nvidia-cuda-nvcc wheel (a dev dependency, so a machine with only Python has it), else
    the first on PATH. The wheel's comes before PATH so that every machine counts registers
    with the same, pinned ptxas."""
    import shutil

    explicit = os.environ.get("CUTE_FA_PTXAS")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise FileNotFoundError(f"CUTE_FA_PTXAS={explicit!r} is not an executable file")
        return explicit
    wheel = sorted(wheel_ptxas())  # nvidia/cu13/... sorts after nvidia/cu12/...
    if wheel:
        return wheel[-1]
    on_path = shutil.which("ptxas")
    if on_path:
        return on_path
    raise FileNotFoundError(
        "ptxas not found: install the dev extras (pip install -e \".[dev]\" brings NVIDIA's "
        "nvidia-cuda-nvcc wheel), put a CUDA toolkit's ptxas on PATH, or set CUTE_FA_PTXAS")


def wheel_ptxas() -> list:
    """ptxas binaries of installed nvidia-cuda-nvcc wheels (nvidia/cu<N>/bin/ptxas)."""
    import glob
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [p for d in spec.submodule_search_locations
            for p in glob.glob(os.path.join(d, "cu*", "bin", "ptxas")) if os.access(p, os.X_OK)]


def ptxas_resources(ptx: str, arch: str) -> dict:
    """Registers, spills and static shared memory of each kernel in `ptx`, from `ptxas -v`."""
    ptxas = ptxas_path()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        cmd = [ptxas, f"-arch={arch}", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")]
        out = subprocess.run(cmd, capture_output=True, text=True)
    text = out.stderr + out.stdout
    if out.returncode:  # e.g. a ptxas older than the PTX ISA the DSL emits
        raise RuntimeError(f"{ptxas} -arch={arch} failed:\n{text}")
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", text)]
    spill_st = [int(x) for x in re.findall(r"(\d+) bytes spill stores", text)]
    spill_ld = [int(x) for x in re.findall(r"(\d+) bytes spill loads", text)]
    return {"registers": max(regs), "spill_stores": sum(spill_st), "spill_loads": sum(spill_ld),
            "log": text, "ptxas": ptxas}
