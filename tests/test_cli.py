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
    assert "thread 37 (warp 1, lane 5) holds query 17 and 25, keys 2..3, 10..11, …, 58..59 " \
        "(every 8)," in out.stdout
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


def _no_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the machine without a GPU")


@pytest.mark.parametrize("command", ["demo", "bench", "probe"])
def test_gpu_commands_refuse_cleanly_without_gpu(command, tmp_path):
    _no_gpu()
    out_dir = tmp_path / "bench-out"
    out = run(command, *(["--out", str(out_dir)] if command == "bench" else []))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert f"error: {command} needs a CUDA GPU" in out.stderr
    assert "torch.cuda.is_available() is False" in out.stderr
    assert not out_dir.exists()  # bench wrote nothing


def test_precompile_without_gpu_names_the_flag():
    _no_gpu()
    out = run("precompile", "--head-dims", "64,128")  # the README's own command
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "precompile needs --arch (e.g. --arch sm_90a)" in out.stderr


@pytest.mark.parametrize("args, message", [
    (["precompile", "--head-dims", "60"], "--head-dims: each head_dim must be a multiple of 8"),
    (["precompile", "--head-dims", "0", "--arch", "sm_90a"], "each head_dim must be a multiple"),
    (["precompile", "--head-dims", "6x4"], "--head-dims must be comma-separated head dims"),
    (["precompile", "--dtypes", "float32", "--arch", "sm_90a"], "--dtypes must name float16 or "
                                                                 "bfloat16, got 'float32'"),
    (["precompile", "--arch", "sm_90a", "--decode-groups", "4", "--page-sizes", "24"],
     "--page-sizes must hold multiples of 16"),
    (["precompile", "--arch", "sm_90a", "--page-sizes", "64"],
     "--page-sizes needs --decode-groups"),
    (["precompile", "--arch", "sm_90a", "--deterministic"], "--deterministic needs --backward"),
    (["precompile", "--arch", "sm_70"], "--arch must be one of sm_80, sm_86"),
    (["precompile", "--arch", "foo"], "arch must be one of"),
    (["precompile", "--arch", "90"], "got '90'"),
    (["probe", "--head-dim", "60"], "head_dim must be a multiple of 8"),
    (["demo", "--seqlen", "0"], "--seqlen must be at least 1"),
])
def test_bad_values_are_refused_by_name(args, message):
    out = run(*args)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert message in out.stderr
    assert "no tile configuration" not in out.stderr


def test_help_shows_defaults():
    out = run("precompile", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "--head-dims HEAD_DIMS comma-separated head dims" in text
    assert "(default: 64,128)" in text and "(default: auto)" in text
    assert "required without one" in text
    for command in ("tour", "layouts", "demo", "probe", "bench"):
        help_text = run(command, "--help").stdout
        assert "(default:" in help_text, command


def test_console_script():
    import shutil
    from pathlib import Path

    script = Path(sys.executable).parent / "cute-fa"
    script = str(script) if script.exists() else shutil.which("cute-fa")
    assert script, "the cute-fa console script is not installed (pip install -e .)"
    out = subprocess.run([script, "layouts", "--tid", "1"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("thread 1 (warp 0, lane 1)")
    assert "usage: cute-fa" in subprocess.run([script, "--help"], capture_output=True,
                                              text=True, timeout=600).stdout


def test_output_into_a_closed_pipe_is_not_a_traceback():
    """`cute-fa layouts --tid 1 | head -1`: the reader stops early; the command ends quietly."""
    out = subprocess.run(f"{sys.executable} -m cute_fa layouts --tid 1 | head -1", shell=True,
                         capture_output=True, text=True, timeout=600)
    assert out.stdout.startswith("thread 1 (warp 0, lane 1)")
    assert "Traceback" not in out.stderr and "BrokenPipeError" not in out.stderr, out.stderr


def test_precompile_shows_each_kernel_and_says_where_it_came_from(tmp_path):
    """precompile prints a line per kernel as it goes, then how many were compiled and how
    many were found in the cache (a second run finds them all)."""
    import os

    env = dict(os.environ, CUTE_FA_CACHE_DIR=str(tmp_path))
    args = [sys.executable, "-m", "cute_fa", "precompile", "--head-dims", "64", "--dtypes",
            "float16", "--arch", "sm_80", "--backend", "sm80"]
    first = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stderr
    lines = first.stderr.strip().splitlines()
    assert lines and all(line.startswith(f"[{i + 1}/{len(lines)}] sm80 sm_80 float16 head_dim 64")
                         for i, line in enumerate(lines)), lines
    assert first.stdout.strip() == f"{len(lines)} kernels: {len(lines)} compiled"
    second = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert second.stdout.strip() == f"{len(lines)} kernels: {len(lines)} from the disk cache"
