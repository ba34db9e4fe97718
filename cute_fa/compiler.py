"""Compiling kernels: keys, fake arguments, an in-memory and an on-disk cache, resources.

A kernel is compiled once per key (`cute_fa.backends`: arch, causal, tile and its backend's fields)
with fake tensors whose batch, sequence and head extents and strides are
symbolic, so a new shape never recompiles. Compiled kernels are kept in memory
and exported as object files under the cache directory ($CUTE_FA_CACHE_DIR, by
default ~/.cache/cute_fa), keyed by the key and a fingerprint of cute_fa's own
sources and the DSL's version, so a new process starts warm.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path

from .backends import KERNELS, KernelKey, backend_of

__all__ = ["KernelKey", "compile_kernel", "get_kernel", "key_digest", "ptxas_resources",
           "wait_for_saves"]

_PACKAGE_DIR = Path(__file__).resolve().parent
_EXPORT_NAME = "cute_fa_kernel"


def key_digest(key: KernelKey) -> str:
    """The cache file name of `key`: its backend and fields, and the fingerprint of the sources
    and DSL that compile it."""
    fields = {k: v for k, v in sorted(vars(key).items()) if k != "tile"}
    tile = sorted(asdict(key.tile).items()) if hasattr(key, "tile") else None
    text = repr((key.backend, tile, sorted(fields.items()), _fingerprint(key.backend)))
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
    importing anything), plus this file (the compile options and fake arguments). The
    explanations (cute_fa.explain) read the layouts and never shape a kernel."""
    start = _PACKAGE_DIR / "kernels" / f"{KERNELS[backend].module}.py"
    seen: set = set()
    todo = [start, _PACKAGE_DIR / "compiler.py", _PACKAGE_DIR / "backends.py"]
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


def _fingerprint(backend: str = "sm80") -> str:
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


def cache_dir() -> Path:
    root = os.environ.get("CUTE_FA_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "cute_fa")
    return Path(root)


def fake_arguments(key: KernelKey) -> tuple:
    """Fake tensors and scalars for `cute.compile`, one per entry of the key's backend's
    `arguments`: batch, sequence and head extents and strides symbolic, so a new shape never
    recompiles."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from .layouts._types import cutlass_dtype

    if hasattr(key, "tile"):
        dtype, head_dim = cutlass_dtype(key.tile.dtype), key.tile.head_dim
        # split-KV kernels write float32 partials
        out_dtype = cutlass.Float32 if getattr(key, "split_kv", False) else dtype
    else:  # the merge
        dtype, head_dim, out_dtype = cutlass_dtype(key.in_dtype), key.head_dim, \
            cutlass_dtype(key.out_dtype)

    def qkvo(element=dtype, rank=4):
        stride = tuple(cute.sym_int64(divisibility=8) for _ in range(rank - 1)) + (1,)
        shape = tuple(cute.sym_int() for _ in range(rank - 1)) + (head_dim,)
        return make_fake_tensor(element, shape, stride=stride, assumed_align=16)

    def lse():
        return make_fake_tensor(cutlass.Float32, (cute.sym_int(), cute.sym_int(), cute.sym_int()),
                                stride=(cute.sym_int64(), cute.sym_int64(), 1), assumed_align=4)

    def int32_vector():
        return make_fake_tensor(cutlass.Int32, (cute.sym_int(),), stride=(1,), assumed_align=4)

    def int32_matrix():
        return make_fake_tensor(cutlass.Int32, (cute.sym_int(), cute.sym_int()),
                                stride=(cute.sym_int64(), 1), assumed_align=4)

    def lse_parts():
        return make_fake_tensor(cutlass.Float32, tuple(cute.sym_int() for _ in range(4)),
                                stride=tuple(cute.sym_int64() for _ in range(3)) + (1,),
                                assumed_align=4)

    def int32_tensor3():
        return make_fake_tensor(cutlass.Int32, tuple(cute.sym_int() for _ in range(3)),
                                stride=(cute.sym_int64(), cute.sym_int64(), 1), assumed_align=4)

    def accum3():
        return make_fake_tensor(cutlass.Float32, tuple(cute.sym_int() for _ in range(3)),
                                stride=(cute.sym_int64(), cute.sym_int64(), 1), assumed_align=16)

    make = {"qkvo": qkvo, "accum3": accum3, "int32_tensor3": int32_tensor3,
            "out": lambda: qkvo(out_dtype), "lse": lse,
            "o_parts": lambda: qkvo(dtype, 5), "lse_parts": lse_parts,
            "int32_vector": int32_vector, "int32_matrix": int32_matrix,
            "float32": lambda: cutlass.Float32(1.0), "int32": lambda: cutlass.Int32(0)}
    return tuple(make[kind]() for _, kind in backend_of(key).arguments) + (
        make_fake_stream(use_tvm_ffi_env_stream=True),)


def compile_kernel(key: KernelKey, *, keep_ptx: bool = False):
    """cute.compile the forward kernel for `key` (needs no GPU)."""
    import cutlass.cute as cute

    kernel = backend_of(key).build(key)
    options = f"--gpu-arch={key.arch} --enable-tvm-ffi"
    if not keep_ptx:
        return cute.compile(kernel, *fake_arguments(key), options=options)
    with tempfile.TemporaryDirectory() as tmp:  # the PTX text stays on the result
        options += f" --keep-ptx --keep-cubin --dump-dir={tmp}"
        return cute.compile(kernel, *fake_arguments(key), options=options)


# The one in-memory cache of compiled kernels, by KernelKey and, for `interface`, by the call's
# request (device, dtype, head_dim, causal, backend, ...) so a call builds no key once warm.
memory_cache: dict = {}
_lock = threading.Lock()
_saving: list = []


def get_kernel(key: KernelKey):
    """The compiled kernel for `key`: from memory, else from disk, else compiled (and saved)."""
    fn = memory_cache.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = memory_cache.get(key)
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
            memory_cache[key] = fn
    return fn


def wait_for_saves() -> None:
    """Block until every compiled kernel is written to the disk cache."""
    while _saving:
        _saving.pop().join()


def _object_path(key: KernelKey) -> Path:
    return cache_dir() / f"{key_digest(key)}.o"


_runtime_loaded: list = []


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
    driver = _driver_cuda_major()
    usable = [v for v in flavors if driver is None or v <= driver]
    return flavors[max(usable or flavors)]


def _driver_cuda_major() -> int | None:
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return version.value // 1000
    except (OSError, AttributeError):
        pass
    return None


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
    path = _object_path(key)
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

    path = _object_path(key)
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
    wheel = sorted(_wheel_ptxas())  # nvidia/cu13/... sorts after nvidia/cu12/...
    if wheel:
        return wheel[-1]
    on_path = shutil.which("ptxas")
    if on_path:
        return on_path
    raise FileNotFoundError(
        "ptxas not found: install the dev extras (pip install -e \".[dev]\" brings NVIDIA's "
        "nvidia-cuda-nvcc wheel), put a CUDA toolkit's ptxas on PATH, or set CUTE_FA_PTXAS")


def _wheel_ptxas() -> list:
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
