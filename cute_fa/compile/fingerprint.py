"""The name of a compiled kernel on disk: its key and a fingerprint of everything that can change
its code (cute_fa's kernel sources, the DSL's version and CUDA flavor), so a stale object never
loads. Read without importing the DSL: this runs on the warm path of a new process."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import asdict
from pathlib import Path

from .keys import KernelKey
from .registry import KERNELS

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def key_digest(key: KernelKey) -> str:
    """The cache file name of `key`: its backend and fields, and the fingerprint of the sources
    and DSL that compile it."""
    fields = {k: v for k, v in sorted(vars(key).items()) if k != "tile"}
    tile = sorted(asdict(key.tile).items()) if hasattr(key, "tile") else None
    text = repr((key.backend, tile, sorted(fields.items()), fingerprint(key.backend)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def dsl_version() -> str:
    """nvidia-cutlass-dsl's version, read without importing the DSL (the warm path never does)."""
    from importlib import metadata

    try:
        return metadata.version("nvidia-cutlass-dsl")
    except metadata.PackageNotFoundError:
        return "unknown"


_fp_cache: dict = {}


def kernel_sources(backend: str) -> list[Path]:
    """Every source file that can change the code of `backend`'s kernels: its module and,
    transitively, every cute_fa module it imports (read from the import statements, without
    importing anything), plus the compile package's
    modules that shape a compile (options, fake arguments, keys, argument lists). The
    explanations (cute_fa.explain) read the layouts and never shape a kernel."""
    start = _PACKAGE_DIR / "kernels" / (KERNELS[backend].module.replace(".", "/") + ".py")
    seen: set = set()
    todo = [start] + [_PACKAGE_DIR / "compile" / f"{name}.py"
                      for name in ("build", "fake", "keys", "registry")]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file() or "explain" in path.relative_to(_PACKAGE_DIR).parts:
            continue
        seen.add(path)
        todo.extend(_imported_files(path))
    return sorted(seen)


# `from .x import a, b` / `from ..pkg import (a,\n b)`, anywhere in a file. A regex, not the ast
# module: this runs on the warm path of a new process (the cache file name needs it), where
# parsing every kernel source cost ~35 ms. A match inside a docstring only adds a file to hash.
_RELATIVE_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.+)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)",
                              re.M)


def _imported_files(path: Path) -> list[Path]:
    """The cute_fa files `path` imports with relative imports (anywhere in it)."""
    out = []
    for dots, module, names in _RELATIVE_IMPORT.findall(path.read_text()):
        base = path.parent
        for _ in range(len(dots) - 1):
            base = base.parent
        for part in module.split(".") if module else []:
            base = base / part
        out.append(base.with_suffix(".py") if not base.is_dir() else base / "__init__.py")
        if base.is_dir():  # from .pkg import submodule, name
            for name in re.sub(r"#[^\n]*", "", names).strip("()").split(","):
                if name.split():
                    out.append(base / f"{name.split()[0]}.py")
    return out


def fingerprint(backend: str = "sm80") -> str:
    """Hash of the sources that shape a backend's kernels and of the DSL's version: stale
    objects never load."""
    if backend not in _fp_cache:
        h = hashlib.sha256()
        for path in kernel_sources(backend):
            h.update(path.relative_to(_PACKAGE_DIR).as_posix().encode())
            h.update(path.read_bytes())
        h.update(dsl_version().encode())
        # objects compiled by one CUDA flavor of the DSL are not loaded beside another's runtime
        h.update(Path(dsl_runtime_library() or "").parent.parent.name.encode())
        _fp_cache[backend] = h.hexdigest()[:16]
    return _fp_cache[backend]


def dsl_runtime_library() -> str | None:
    """The DSL runtime library of the CUDA flavor the DSL itself loads: the newest installed
    cu<N> (nvidia-cutlass-dsl[cu13] installs cu12 and cu13) that the driver supports, the
    newest installed where no driver answers. Read without importing the DSL."""
    import glob
    import importlib.util

    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    if spec is None or not spec.submodule_search_locations:
        return None
    flavors = {}
    for d in spec.submodule_search_locations:
        for lib in glob.glob(os.path.join(d, "cu*", "lib", "libcute_dsl_runtime.so")):
            version = Path(lib).parent.parent.name[2:]
            if version.isdigit():
                flavors[int(version)] = lib
    if not flavors:
        return None
    driver = driver_cuda_major()
    usable = [v for v in flavors if driver is None or v <= driver]
    return flavors[max(usable or flavors)]


def driver_cuda_major() -> int | None:
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return version.value // 1000
    except (OSError, AttributeError):
        pass
    return None
