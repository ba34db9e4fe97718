"""The on-disk kernel cache, on the CPU: a compiled kernel is written (off the first call's
path), a new process's lookup loads it instead of compiling, and a damaged file is compiled
again with a warning."""

import warnings

import pytest

from cute_fa import compiler
from cute_fa.tuning import kernel_key


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_FA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler, "memory_cache", {})
    return tmp_path


def _no_compile(key, **_):
    raise AssertionError(f"compiled {key} although the disk cache holds it")


def test_kernel_is_saved_then_loaded_without_compiling(cache, monkeypatch):
    key = kernel_key("sm_80", "bfloat16", 64, False, "sm80")
    first = compiler.get_kernel(key)
    compiler.wait_for_saves()
    path = compiler._object_path(key)
    assert path.parent == cache and path.is_file() and path.stat().st_size > 0
    assert compiler.get_kernel(key) is first  # memory

    monkeypatch.setattr(compiler, "memory_cache", {})  # as in a new process
    monkeypatch.setattr(compiler, "compile_kernel", _no_compile)
    loaded = compiler.get_kernel(key)
    assert callable(loaded) and loaded is not first

    # another key (causal) is another file: it would have to be compiled
    other = kernel_key("sm_80", "bfloat16", 64, True, "sm80")
    assert compiler._object_path(other) != path
    with pytest.raises(AssertionError, match="although the disk cache"):
        compiler.get_kernel(other)


def test_damaged_cache_file_is_compiled_again(cache, monkeypatch):
    key = kernel_key("sm_80", "float16", 128, True, "sm80")
    path = compiler._object_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".so").write_bytes(b"not an object file")
    compiled = []
    monkeypatch.setattr(compiler, "compile_kernel", lambda k, **_: compiled.append(k) or "fresh")
    monkeypatch.setattr(compiler, "_save", lambda k, c: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert compiler.get_kernel(key) == "fresh"
    compiler.wait_for_saves()
    assert compiled == [key]
    assert any("cannot load cached kernel" in str(w.message) for w in caught)
