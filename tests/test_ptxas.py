"""The resource checks find a ptxas on a machine that has only Python: the one in NVIDIA's
nvidia-cuda-nvcc wheel (a dev dependency), with no CUDA toolkit on PATH."""

import os
from pathlib import Path

import pytest

from cute_fa.compile import ptxas

# One kernel by hand: 32-bit adds into a global pointer, so ptxas reports its registers.
PTX = """
.version 8.0
.target sm_80
.address_size 64
.visible .entry add_one(.param .u64 p)
{
    .reg .b32 r<3>;
    .reg .b64 a<2>;
    ld.param.u64 a0, [p];
    cvta.to.global.u64 a1, a0;
    ld.global.u32 r0, [a1];
    add.s32 r1, r0, 1;
    st.global.u32 [a1], r1;
    ret;
}
"""


@pytest.fixture
def no_toolkit(monkeypatch, tmp_path):
    """PATH holds nothing but an empty folder, and CUTE_FA_PTXAS is unset."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUTE_FA_PTXAS", raising=False)


def test_wheel_ptxas_without_path(no_toolkit):
    path = ptxas.ptxas_path()
    assert Path(path).name == "ptxas" and Path(path).parent.parent.name.startswith("cu")
    res = ptxas.ptxas_resources(PTX, "sm_80")
    assert res["ptxas"] == path
    assert 1 <= res["registers"] <= 16
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0


def test_explicit_ptxas(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTE_FA_PTXAS", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="CUTE_FA_PTXAS"):
        ptxas.ptxas_path()
    wheel = sorted(ptxas.wheel_ptxas())[-1]
    monkeypatch.setenv("CUTE_FA_PTXAS", wheel)
    assert ptxas.ptxas_path() == wheel


def test_no_ptxas_anywhere_says_how_to_get_one(no_toolkit, monkeypatch):
    monkeypatch.setattr(ptxas, "wheel_ptxas", lambda: [])
    with pytest.raises(FileNotFoundError, match=r"pip install -e \"\.\[dev\]\"") as err:
        ptxas.ptxas_resources(PTX, "sm_80")
    assert "CUTE_FA_PTXAS" in str(err.value)


def test_ptx_error_is_reported(no_toolkit):
    with pytest.raises(RuntimeError, match="ptxas .*-arch=sm_80 failed"):
        ptxas.ptxas_resources(PTX.replace("ret;", "bogus;"), "sm_80")


def test_the_suite_does_not_need_path():
    """CI hides the toolkit's ptxas (.ci/run); this holds it to that when run there."""
    if os.environ.get("CI") != "true":
        pytest.skip("CI's PATH is the one checked")
    import shutil

    assert shutil.which("ptxas") is None
