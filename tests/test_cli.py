"""The command line: `python -m cute_fa layouts --tid 0` and the tour."""

import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "cute_fa", *args], capture_output=True, text=True,
                          timeout=600)


def test_layouts_tid0():
    out = run("layouts", "--tid", "0")
    assert out.returncode == 0, out.stderr
    assert "thread 0 (warp 0, lane 0) holds query 0 and 8" in out.stdout
    assert "talks to lanes 2 and 1" in out.stdout
    assert "S: (0,0) (0,1) (8,0) (8,1) (0,8)" in out.stdout


def test_layouts_other_thread_and_config():
    out = run("layouts", "--tid", "37", "--head-dim", "128", "--block-m", "128", "--num-threads", "256")
    assert out.returncode == 0, out.stderr
    # 8 warps of 16 rows each; thread 37 = warp 1, lane 5 = quad 1: rows 16+1 and 16+9,
    # keys 2a, 2a+1 (+8j) with a = 1; partners lane 5^2 = 7 and 5^1 = 4
    assert "thread 37 (warp 1, lane 5) holds query 17 and 25, keys 2,3,10,11," in out.stdout
    assert "talks to lanes 7 and 4" in out.stdout


@pytest.mark.parametrize("args, name", [(["--tid", "128"], "tid"), (["--head-dim", "60"], "head_dim")])
def test_layouts_bad_input(args, name):
    out = run("layouts", *args)
    assert out.returncode == 2
    assert name in out.stderr


def test_default_command_prints_tour_without_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this checks the CPU-only path")
    out = run()
    assert out.returncode == 0, out.stderr
    assert "no CUDA GPU here" in out.stdout
    assert "warp 3: threads 96..127, queries 48..63" in out.stdout
    assert "(1,0): row-major    64 -> swizzled 72" in out.stdout
