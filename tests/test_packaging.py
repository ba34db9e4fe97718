"""What a user installs and sees: license, console script, typed public API, the DSL's
CUDA flavour, the dev extras."""

import tomllib
import typing
from pathlib import Path

import pytest

import cute_fa

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_file_matches_the_declared_license():
    assert PYPROJECT["project"]["license"] == "BSD-3-Clause"
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License")
    assert "Neither the name of the copyright holder" in text


def test_console_script_declared():
    assert PYPROJECT["project"]["scripts"] == {"cute-fa": "cute_fa.__main__:main"}


def test_dir_lists_the_public_api():
    names = dir(cute_fa)
    assert {"forward", "sdpa", "precompile", "layouts", "reference", "__version__"} <= set(names)
    assert "importlib" not in names and "os" not in names


def test_public_api_is_typed():
    import torch

    assert (ROOT / "cute_fa" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["cute_fa"]
    hints = typing.get_type_hints(cute_fa.forward)
    assert hints["q"] is torch.Tensor and hints["causal"] is bool
    assert set(typing.get_args(hints["backend"])) == {"auto", "sm80", "tma", "sm90"}
    assert typing.get_type_hints(cute_fa.sdpa)["return"] is torch.Tensor
    assert "arch" in typing.get_type_hints(cute_fa.precompile)


def test_dev_extras():
    dev = " ".join(PYPROJECT["project"]["optional-dependencies"]["dev"])
    for package in ("pytest", "nbconvert", "nbclient", "nvidia-cuda-nvcc"):
        assert package in dev


def test_dsl_flavour_follows_the_driver(monkeypatch):
    """nvidia-cutlass-dsl[cu13] installs both CUDA flavours of the DSL; the warm path loads
    the runtime of the one the DSL itself picks: the newest the driver supports."""
    from cute_fa.compile import fingerprint

    assert any(d.startswith("nvidia-cutlass-dsl[cu13]") for d in PYPROJECT["project"]["dependencies"])
    import glob
    import importlib.util

    roots = importlib.util.find_spec("nvidia_cutlass_dsl").submodule_search_locations
    flavours = {Path(p).parent.parent.name for d in roots
                for p in glob.glob(f"{d}/cu*/lib/libcute_dsl_runtime.so")}
    assert {"cu12", "cu13"} <= flavours, "pip install -e . installs both flavours"
    for driver, expected in ((12, "cu12"), (13, "cu13"), (14, "cu13"), (None, "cu13")):
        monkeypatch.setattr(fingerprint, "driver_cuda_major", lambda d=driver: d)
        assert Path(fingerprint.dsl_runtime_library()).parent.parent.name == expected


def test_readme_cli_commands_parse():
    """Every `python -m cute_fa ...` the README shows is accepted by the CLI's parser."""
    import re
    import shlex

    from cute_fa.__main__ import build_parser

    text = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[dev]" && python -m pytest' in text
    commands = re.findall(r"python -m cute_fa([^`\n]*)", text)
    assert len(commands) >= 5
    for tail in commands:
        args = [a for a in shlex.split(tail) if not a.startswith("<")]
        args = [a for a in args if a not in ("etc.",)]
        build_parser().parse_args(args)
