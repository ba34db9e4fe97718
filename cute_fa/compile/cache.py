"""The compile cache: each kernel key compiled once, kept in memory and exported as an object file
under `cache_dir()` ($CUTE_FA_CACHE_DIR, by default ~/.cache/cute_fa), named by the key and the
fingerprint of what compiles it (`compile.fingerprint`), so a new process starts warm and loads
kernels through TVM FFI without importing the DSL."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

from .build import compile_kernel
from .fingerprint import dsl_runtime_library, key_digest
from .keys import KernelKey

_EXPORT_NAME = "cute_fa_kernel"  # the symbol a kernel's object file exports


def cache_dir() -> Path:
    root = os.environ.get("CUTE_FA_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "cute_fa")
    return Path(root)




# The in-memory cache of compiled kernels, by kernel key, and nothing else (the plans that name
# the keys are `runtime.plan`'s own cache)
compiled_kernels: dict = {}
_lock = threading.Lock()
_saving: list = []


def get_kernel(key: KernelKey):
    """The compiled kernel for `key`: from memory, else from disk, else compiled (and saved)."""
    fn = compiled_kernels.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = compiled_kernels.get(key)
        if fn is None:
            fn = _load(key)
            if fn is None:
                compiled = compile_kernel(key)
                # exporting the object (~0.3 s) is off the first call's path; the thread is
                # not a daemon, so the file is complete before the interpreter exits
                saver = threading.Thread(target=_save, args=(key, compiled),
                                         name=f"cute_fa-save-{key_digest(key)[:8]}")
                saver.start()
                _saving.append(saver)
                fn = compiled
            compiled_kernels[key] = fn
    return fn


def wait_for_saves() -> None:
    """Block until every compiled kernel is written to the disk cache."""
    while _saving:
        _saving.pop().join()


def object_path(key: KernelKey) -> Path:
    return cache_dir() / f"{key_digest(key)}.o"


_runtime_loaded: list = []


def _load_shared(path: Path):
    """Load a linked kernel through TVM FFI alone: no DSL import on the warm path."""
    import ctypes

    import tvm_ffi

    if not _runtime_loaded:
        runtime = dsl_runtime_library()
        for lib in ([runtime] if runtime else []) + [tvm_ffi.libinfo.find_libtvm_ffi()]:
            _runtime_loaded.append(ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL))
    return tvm_ffi.load_module(str(path))[_EXPORT_NAME]


def _load(key: KernelKey):
    path = object_path(key)
    try:
        if path.with_suffix(".so").is_file():
            return _load_shared(path.with_suffix(".so"))
        if path.is_file():
            import cutlass.cute as cute

            return getattr(cute.runtime.load_module(str(path), enable_tvm_ffi=True), _EXPORT_NAME)
    except Exception as exc:  # a truncated or foreign object: recompile and replace it
        import warnings

        warnings.warn(f"cute_fa: cannot load cached kernel {path.stem} ({type(exc).__name__}: "
                      f"{exc}); compiling it again", RuntimeWarning, stacklevel=3)
        return None
    return None


def _save(key: KernelKey, compiled) -> None:
    """Export the object file and, where a C compiler is at hand, link it into a .so."""
    import shutil

    path = object_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.o")
        compiled.export_to_c(object_file_path=str(tmp), function_name=_EXPORT_NAME)
        os.replace(tmp, path)
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc:
            tmp_so = path.with_name(f".{path.stem}.{os.getpid()}.tmp.so")
            subprocess.run([cc, "-shared", "-o", str(tmp_so), str(path)], check=True,
                           capture_output=True)
            os.replace(tmp_so, path.with_suffix(".so"))
    except Exception:  # an unwritable cache costs only the next process's compile
        pass
