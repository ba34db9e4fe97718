"""The package's shape: what imports what (every import, inside functions too), who may use
whose names, file sizes, the backend registry and the kernels' argument lists."""

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from cute_fa.compile.keys import KernelKey, Sm80Key, Sm90Key, TmaKey
from cute_fa.compile.registry import KERNELS, REGISTRY

PACKAGE = Path(__file__).resolve().parent.parent / "cute_fa"
MODULES = {p: ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(
    ".__init__") for p in PACKAGE.rglob("*.py")}
KNOWN = set(MODULES.values())
MAX_LINES = 700


def _package_of(path: Path) -> str:
    name = MODULES[path]
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def _type_checking_blocks(tree) -> set:
    """The nodes under `if TYPE_CHECKING:` (imports for type checkers only)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    return skipped


def imports(path: Path) -> list:
    """(line, module, names) of every cute_fa import in `path`, at module level or inside a
    function; `names`: what a `from ... import` takes (submodules resolved as modules)."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_blocks(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(path).split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "cute_fa":
                continue
            out.append((node.lineno, target, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "cute_fa":
                    out.append((node.lineno, a.name, []))
    return out


def _edges(path: Path) -> set:
    """The cute_fa modules `path` imports (a `from pkg import name` of a submodule counts as
    importing that submodule)."""
    found = set()
    for _, target, names in imports(path):
        if target in KNOWN:
            found.add(target)
        found.update(f"{target}.{n}" for n in names if f"{target}.{n}" in KNOWN)
    return found


def test_no_import_cycles_counting_imports_inside_functions():
    graph = {MODULES[p]: _edges(p) - {MODULES[p]} for p in MODULES}
    state: dict = {}

    def visit(m, stack):
        if state.get(m) == "done":
            return
        assert state.get(m) != "open", "import cycle: " + " -> ".join(stack + [m])
        state[m] = "open"
        for n in sorted(graph.get(m, ())):
            visit(n, stack + [m])
        state[m] = "done"

    for m in sorted(graph):
        visit(m, [])


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _package_private(module: str) -> bool:
    """A module whose own name is private (layouts/_read.py, layouts/_types.py): its package
    shares it, its names are meant for the package's kernels and explanations."""
    return _private(module.rsplit(".", 1)[-1])


def private_reaches(path: Path) -> list:
    """Where `path` uses a name another cute_fa module keeps private: `from m import _x`,
    `m._x` or `m.Public._x` through an imported module `m`."""
    tree = ast.parse(path.read_text())
    own = MODULES[path]
    found, aliases = [], {}
    for line, target, names in imports(path):
        for n in names:
            module = f"{target}.{n}"
            if module in KNOWN:
                aliases[n] = module
            elif _private(n) and target != own and not _package_private(target):
                found.append(f"{MODULES[path]}:{line}: from {target} import {n}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "cute_fa":
                    aliases[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.asname and a.name in aliases:
                    aliases[a.asname] = aliases[a.name]
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        base = node.value
        if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
            base = base.value  # m.Public._x
        if isinstance(base, ast.Name) and base.id in aliases:
            module = aliases[base.id]
            if module != own and not _package_private(module):
                found.append(f"{MODULES[path]}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_uses_another_modules_private_names():
    found = [reach for p in sorted(MODULES) for reach in private_reaches(p)]
    assert found == [], "\n".join(found)


def test_the_private_name_check_can_fail(tmp_path):
    """The walk above finds each kind of reach it looks for (on a file written here)."""
    probe = tmp_path / "probe.py"  # read as if it were cute_fa/explain/probe.py
    probe.write_text("from ..api.checks import _check_lse\nfrom ..runtime import plan\n"
                     "def f():\n    from ..compile import cache\n"
                     "    return plan._PLANS, cache._save, plan.ForwardPlan._fields_x\n")
    MODULES[probe] = "cute_fa.explain.probe"
    try:
        found = private_reaches(probe)
    finally:
        MODULES.pop(probe)
    assert len(found) == 4, found


def test_no_file_over_the_line_budget():
    long = {MODULES[p]: n for p in MODULES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_old_hub_is_gone():
    assert not (PACKAGE / "interface.py").exists()
    assert not (PACKAGE / "compiler.py").exists() and not (PACKAGE / "backends.py").exists()


def test_kernels_and_layouts_never_import_the_explanations():
    for path, name in MODULES.items():
        if name.startswith(("cute_fa.kernels", "cute_fa.layouts", "cute_fa.compile")):
            assert not any(m.startswith("cute_fa.explain") for m in _edges(path)), path


def test_layers_import_downwards_only():
    """compile/ and kernels/ never import the runtime or the API; the runtime never imports
    the API; nothing but the CLI imports the benchmarks."""
    below = {"cute_fa.compile": ("cute_fa.runtime", "cute_fa.api", "cute_fa.bench"),
             "cute_fa.kernels": ("cute_fa.runtime", "cute_fa.api", "cute_fa.bench"),
             "cute_fa.layouts": ("cute_fa.runtime", "cute_fa.api", "cute_fa.compile"),
             "cute_fa.runtime": ("cute_fa.api", "cute_fa.bench")}
    for path, name in MODULES.items():
        for layer, forbidden in below.items():
            if name.startswith(layer):
                bad = [m for m in _edges(path) if m.startswith(forbidden)]
                assert bad == [], (name, bad)
        if not name.startswith(("cute_fa.bench", "cute_fa.__main__")):
            assert not any(m.startswith("cute_fa.bench") for m in _edges(path)), name


def test_the_warm_path_imports_without_the_dsl():
    """A call whose kernels are in the disk cache never imports the DSL (seconds): the public
    functions, autograd, the plan and the launch, and the reference and introspection's
    DSL-free parts."""
    code = ("import sys, cute_fa.reference, cute_fa.visibility, cute_fa.arch, "
            "cute_fa.compile.registry, cute_fa.runtime.plan, cute_fa.runtime.run, "
            "cute_fa.api.forward, cute_fa.api.backward, cute_fa.api.autograd, cute_fa.api.ops;"
            "import cute_fa.layouts.ring;"
            "assert not any(m == 'cutlass' or m.startswith('cutlass.') for m in sys.modules), "
            "sorted(m for m in sys.modules if m.startswith('cutlass'))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr


def test_the_call_path_leaves_torch_dynamo_unloaded():
    """torch._dynamo (and sympy under it) costs a process's first call about 2 s to import
    (6 s where Python has no bytecode cache): an eager call, with grad and with a score_mod,
    leaves it to torch.compile, which loads it before it traces a call. Run with the compiler
    and the launch stood in as `launch_recording` stands them in."""
    code = """
import sys, torch, cute_fa
from cute_fa.api import checks
from cute_fa.runtime import device, plan, run
checks.check_devices = lambda named, device_index: None
device.DEVICES[-1] = device.stand_in("sm_90a", 132)
plan.get_kernel = lambda key: key
run.no_lse = lambda device_index: torch.empty(1, 1, 1)
run.tile_counter = lambda device_index: torch.zeros(1, dtype=torch.int32)
run.launch = lambda device_index, kernel, args: None
q, k, v = (torch.randn(1, 256, 2, 64, dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
cute_fa.forward(q, k, v, causal=True).sum().backward()
cute_fa.forward(q, k, v, score_mod=lambda s, b, h, qi, kv: s * 0.5).sum().backward()
assert 'torch._dynamo' not in sys.modules, 'an eager call imports torch._dynamo'
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr


def test_public_functions_are_functions_in_a_fresh_process():
    """`cute_fa.backward` is the function (no submodule shadows it), before and after the
    custom ops load; every name of __all__ resolves."""
    code = ("import cute_fa, inspect;"
            "assert inspect.isfunction(cute_fa.backward), cute_fa.backward;"
            "import cute_fa.api.ops;"
            "assert inspect.isfunction(cute_fa.backward) and inspect.isfunction(cute_fa.forward);"
            "assert cute_fa.backward_varlen.__module__ == 'cute_fa.api.backward';"
            "[getattr(cute_fa, n) for n in cute_fa.__all__]")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr


def test_registry_records():
    assert set(REGISTRY) == {"sm80", "tma", "sm90"}
    assert REGISTRY["sm80"].key_type is Sm80Key and REGISTRY["tma"].key_type is TmaKey
    assert REGISTRY["sm90"].key_type is Sm90Key
    for name, backend in KERNELS.items():
        assert backend.name == name == backend.key_type.backend
        assert (PACKAGE / "kernels" / (backend.module.replace(".", "/") + ".py")).is_file()
    for backend in REGISTRY.values():
        assert issubclass(backend.key_type, KernelKey)
    assert REGISTRY["sm80"].supports("sm_80") and REGISTRY["sm80"].supports("sm_120a")
    assert not REGISTRY["tma"].supports("sm_86") and REGISTRY["tma"].supports("sm_90a")
    # wgmma is Hopper's alone: sm100 and sm120 have no warpgroup MMA
    assert REGISTRY["sm90"].supports("sm_90a") and not REGISTRY["sm90"].supports("sm_120a")
    assert not REGISTRY["sm90"].supports("sm_100a") and not REGISTRY["sm90"].supports("sm_80")


def test_build_refuses_another_backends_key():
    from cute_fa.layouts import TileConfig

    with pytest.raises(TypeError, match="backend 'tma' takes a TmaKey, got Sm80Key"):
        REGISTRY["tma"].build(Sm80Key("sm_90a", False, TileConfig()))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_takes_the_registered_arguments(name):
    """Each kernel's __call__ takes its backend's arguments in order (tensors, then
    Float32/Int32 scalars, the tensors the scores read as a tuple; Optional where a key field
    switches the argument on), then the stream: what compile.fake builds and runtime.launch's record for the family holds."""
    import cutlass
    import cutlass.cute as cute
    from typing import Optional

    from cute_fa.runtime.launch import RECORDS

    params = list(inspect.signature(KERNELS[name].kernel_class().__call__).parameters.values())
    params = params[1:]  # self
    arguments = KERNELS[name].arguments
    assert len(params) == len(arguments) + 1 and params[-1].name == "stream"
    kinds = {"qkvo": cute.Tensor, "out": cute.Tensor, "lse": cute.Tensor, "accum3": cute.Tensor,
             "o_parts": cute.Tensor, "lse_parts": cute.Tensor, "int32_tensor3": cute.Tensor,
             "int32_vector": cute.Tensor, "int32_matrix": cute.Tensor,
             "float32": cutlass.Float32, "int32": cutlass.Int32, "score_tensors": tuple}
    for param, arg in zip(params, arguments):
        annotation = param.annotation
        if isinstance(annotation, str):  # from __future__ import annotations
            annotation = eval(annotation, {"cute": cute, "cutlass": cutlass,
                                           "Optional": Optional})
        expected = Optional[kinds[arg.kind]] if arg.when else kinds[arg.kind]
        assert annotation == expected, (arg, param.name, annotation)
    fields = RECORDS[name]._fields
    assert fields[:len(arguments)] == tuple(a.name for a in arguments)


def test_fingerprint_covers_the_imported_sources():
    from cute_fa.compile.fingerprint import kernel_sources

    for name in KERNELS:
        files = {p.relative_to(PACKAGE).as_posix() for p in kernel_sources(name)}
        assert f"kernels/{KERNELS[name].module.replace('.', '/')}.py" in files
        assert {"compile/build.py", "compile/fake.py", "compile/keys.py",
                "compile/registry.py"} <= files
        assert not any(f.startswith("explain/") for f in files)
    for name in REGISTRY:
        files = {p.relative_to(PACKAGE).as_posix() for p in kernel_sources(name)}
        assert {"visibility.py", "kernels/common/mask.py", "kernels/common/softmax.py",
                "kernels/sched/block_info.py", "layouts/mma.py", "layouts/smem.py"} <= files
    assert "layouts/tma.py" in {p.relative_to(PACKAGE).as_posix() for p in kernel_sources("tma")}
    assert "kernels/fwd/tma.py" not in {p.relative_to(PACKAGE).as_posix()
                                        for p in kernel_sources("sm80")}
