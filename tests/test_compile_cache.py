"""The on-disk kernel cache, on the CPU: a compiled kernel is written (off the first call's
path), a new process's lookup loads it instead of compiling, and a damaged file is compiled
again with a warning."""

import warnings

import pytest

from cute_fa.compile import cache as compile_cache
from cute_fa.tuning import kernel_key


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_FA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_cache, "compiled_kernels", {})
    return tmp_path


def _no_compile(key, **_):
    raise AssertionError(f"compiled {key} although the disk cache holds it")


def test_kernel_is_saved_then_loaded_without_compiling(cache_dir, monkeypatch):
    key = kernel_key("sm_80", "bfloat16", 64, False, "sm80")
    first = compile_cache.get_kernel(key)
    compile_cache.wait_for_saves()
    path = compile_cache.object_path(key)
    assert path.parent == cache_dir and path.is_file() and path.stat().st_size > 0
    assert compile_cache.get_kernel(key) is first  # memory

    monkeypatch.setattr(compile_cache, "compiled_kernels", {})  # as in a new process
    monkeypatch.setattr(compile_cache, "compile_kernel", _no_compile)
    loaded = compile_cache.get_kernel(key)
    assert callable(loaded) and loaded is not first

    # another key (causal) is another file: it would have to be compiled
    other = kernel_key("sm_80", "bfloat16", 64, True, "sm80")
    assert compile_cache.object_path(other) != path
    with pytest.raises(AssertionError, match="although the disk cache"):
        compile_cache.get_kernel(other)


def test_damaged_cache_file_is_compiled_again(cache_dir, monkeypatch):
    key = kernel_key("sm_80", "float16", 128, True, "sm80")
    path = compile_cache.object_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".so").write_bytes(b"not an object file")
    compiled = []
    monkeypatch.setattr(compile_cache, "compile_kernel", lambda k, **_: compiled.append(k) or "fresh")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert compile_cache.get_kernel(key) == "fresh"
    compile_cache.wait_for_saves()
    assert compiled == [key]
    assert any("cannot load cached kernel" in str(w.message) for w in caught)
