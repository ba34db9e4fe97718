"""The package's shape: what imports what, the backend registry, the kernel arguments."""

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from cute_fa.backends import REGISTRY, KernelKey, Sm80Key, Sm90Key, TmaKey

PACKAGE = Path(__file__).resolve().parent.parent / "cute_fa"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path) -> set:
    """cute_fa modules `path` imports when it is imported (module level, not in functions)."""
    package = _module_name(path) if path.name == "__init__.py" else \
        _module_name(path).rsplit(".", 1)[0]
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` imports nothing at run time
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")
            base = base[:len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)
    known = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    return {m for m in out if m in known}


def test_no_import_cycles():
    graph = {_module_name(p): _top_level_imports(p) for p in PACKAGE.rglob("*.py")}
    state: dict = {}

    def visit(m, stack):
        if state.get(m) == "done":
            return
        assert state.get(m) != "open", "import cycle: " + " -> ".join(stack + [m])
        state[m] = "open"
        for n in graph.get(m, ()):
            visit(n, stack + [m])
        state[m] = "done"

    for m in graph:
        visit(m, [])


def test_kernels_and_layouts_never_import_the_explanations():
    for path in list((PACKAGE / "kernels").glob("*.py")) + list((PACKAGE / "layouts").glob("*.py")):
        assert not any(m.startswith("cute_fa.explain") for m in _top_level_imports(path)), path


def test_reference_and_visibility_import_without_the_dsl():
    code = ("import sys, cute_fa.reference, cute_fa.visibility, cute_fa.arch, cute_fa.backends;"
            "import cute_fa.layouts.ring;"
            "assert not any(m == 'cutlass' or m.startswith('cutlass.') for m in sys.modules), "
            "sorted(m for m in sys.modules if m.startswith('cutlass'))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr


def test_registry_records():
    assert set(REGISTRY) == {"sm80", "tma", "sm90"}
    assert REGISTRY["sm80"].key_type is Sm80Key and REGISTRY["tma"].key_type is TmaKey
    assert REGISTRY["sm90"].key_type is Sm90Key
    for name, backend in REGISTRY.items():
        assert backend.name == name == backend.key_type.backend
        assert issubclass(backend.key_type, KernelKey)
        assert (PACKAGE / "kernels" / f"{backend.module}.py").is_file()
    assert REGISTRY["sm80"].supports("sm_80") and REGISTRY["sm80"].supports("sm_120a")
    assert not REGISTRY["tma"].supports("sm_86") and REGISTRY["tma"].supports("sm_90a")
    # wgmma is Hopper's alone: sm100 and sm120 have no warpgroup MMA
    assert REGISTRY["sm90"].supports("sm_90a") and not REGISTRY["sm90"].supports("sm_120a")
    assert not REGISTRY["sm90"].supports("sm_100a") and not REGISTRY["sm90"].supports("sm_80")


def test_build_refuses_another_backends_key():
    from cute_fa.layouts import TileConfig

    with pytest.raises(TypeError, match="backend 'tma' takes a TmaKey, got Sm80Key"):
        REGISTRY["tma"].build(Sm80Key("sm_90a", False, TileConfig()))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_kernel_takes_the_registered_arguments(name):
    """Each kernel's __call__ takes its backend's arguments in order (tensors, then
    Float32/Int32 scalars), then the stream: what compiler.fake_arguments builds and interface
    launches."""
    import cutlass
    import cutlass.cute as cute

    params = list(inspect.signature(REGISTRY[name].kernel_class().__call__).parameters.values())
    params = params[1:]  # self
    arguments = REGISTRY[name].arguments
    assert len(params) == len(arguments) + 1 and params[-1].name == "stream"
    kinds = {"qkvo": cute.Tensor, "out": cute.Tensor, "lse": cute.Tensor,
             "int32_vector": cute.Tensor, "int32_matrix": cute.Tensor,
             "float32": cutlass.Float32, "int32": cutlass.Int32}
    for param, (arg, kind) in zip(params, arguments):
        annotation = param.annotation
        if isinstance(annotation, str):  # from __future__ import annotations
            annotation = eval(annotation, {"cute": cute, "cutlass": cutlass})
        assert annotation is kinds[kind], (arg, param.name, annotation)


def test_fingerprint_covers_the_imported_sources():
    from cute_fa.compiler import kernel_sources

    for name in REGISTRY:
        files = {p.relative_to(PACKAGE).as_posix() for p in kernel_sources(name)}
        assert f"kernels/{REGISTRY[name].module}.py" in files
        assert {"visibility.py", "kernels/mask.py", "kernels/softmax.py", "layouts/mma.py",
                "layouts/smem.py", "compiler.py", "backends.py"} <= files
        assert not any(f.startswith("explain/") for f in files)
    assert "layouts/tma.py" in {p.relative_to(PACKAGE).as_posix() for p in kernel_sources("tma")}
    assert "kernels/fwd_tma.py" not in {p.relative_to(PACKAGE).as_posix()
                                        for p in kernel_sources("sm80")}
