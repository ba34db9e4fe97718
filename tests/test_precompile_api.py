"""cute_fa.precompile: stays a function after use, checks every argument before compiling."""

import importlib

import pytest

import cute_fa


def test_precompile_stays_callable():
    # the first call imports the module that defines it; that must not replace the function
    with pytest.raises(ValueError, match="head_dims"):
        cute_fa.precompile(head_dims=60, arch="sm_80")
    with pytest.raises(ValueError, match="head_dims"):
        cute_fa.precompile(head_dims=60, arch="sm_80")
    assert callable(cute_fa.precompile)
    importlib.import_module("cute_fa.api.precompile")  # importing it explicitly changes nothing

    assert callable(cute_fa.precompile)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(head_dims=60), ValueError, "head_dims: each head_dim must be a multiple of 8"),
    (dict(head_dims=0), ValueError, "head_dims: each head_dim must be a multiple of 8"),
    (dict(head_dims=(64, 264)), ValueError, "got 264"),
    (dict(head_dims="64"), TypeError, "head_dims must be an int or a sequence"),
    (dict(head_dims=64.0), TypeError, "head_dims must be an int or a sequence"),
    (dict(head_dims=()), ValueError, "head_dims must not be empty"),
    (dict(dtypes="float32"), ValueError, "dtypes must name float16 or bfloat16, got 'float32'"),
    (dict(causal=None), TypeError, "causal must be a bool or a sequence"),
    (dict(causal=(True, 1)), TypeError, "causal must be a bool or a sequence of bools, got 1"),
    (dict(arch="sm_70"), ValueError, "arch must be one of sm_80, .* got 'sm_70'"),
    (dict(arch="foo"), ValueError, "arch must be one of .* got 'foo'"),
    (dict(arch="90"), ValueError, "arch must be one of .* got '90'"),
    (dict(arch=90), TypeError, "arch must be a str"),
    (dict(backend="x"), ValueError, "backend must be one of"),
    (dict(backend="tma", arch="sm_86"), ValueError, "backend='tma' needs an sm90"),
])
def test_bad_arguments(kwargs, error, match, monkeypatch, tmp_path):
    monkeypatch.setenv("CUTE_FA_CACHE_DIR", str(tmp_path))
    kwargs.setdefault("arch", "sm_90a")
    with pytest.raises(error, match=match):
        cute_fa.precompile(**kwargs)
    assert not any(tmp_path.iterdir())  # nothing compiled or written


def test_no_gpu_needs_arch():
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the machine without a GPU")
    with pytest.raises(RuntimeError, match=r"arch= \(e.g. arch='sm_90a'\)"):
        cute_fa.precompile(head_dims=64)


@pytest.mark.parametrize("spelling", ["sm_90a", "sm_90", "sm90", "SM_90A"])
def test_arch_spellings_name_the_gpus_kernel(spelling):
    from cute_fa.arch import Arch

    # precompiling for 'sm_90' must produce the key forward() looks up on an H100/H200
    assert Arch.parse(spelling) == Arch(9, 0) and Arch(9, 0).name == "sm_90a"


def test_precompile_one_kernel_twice(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTE_FA_CACHE_DIR", str(tmp_path))
    keys = cute_fa.precompile(head_dims=64, dtypes="float16", causal=False, arch="sm80")
    assert [(k.arch, k.tile.head_dim, k.tile.dtype, k.causal) for k in keys] == \
        [("sm_80", 64, "float16", False)]
    assert any(p.suffix == ".o" for p in tmp_path.iterdir())
    assert cute_fa.precompile(head_dims=[64], dtypes=["fp16"], causal=[False],
                              arch="sm_80") == keys


def test_env_var_at_import(tmp_path):
    import os
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the machine without a GPU")
    env = dict(os.environ, CUTE_FA_PRECOMPILE="64,128", CUTE_FA_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", "import cute_fa; print('imported')"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "imported" in run.stdout
    assert "CUTE_FA_PRECOMPILE is set but no CUDA GPU is visible: nothing compiled" in run.stderr
    env["CUTE_FA_PRECOMPILE"] = "64,abc"
    run = subprocess.run([sys.executable, "-c", "import cute_fa"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 1
    assert "ValueError: CUTE_FA_PRECOMPILE must be comma-separated head dims" in run.stderr
