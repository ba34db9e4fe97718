import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_CUDA = _has_cuda()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def walkthrough():
    """The configuration of docs/walkthrough.md §3: fp16, d=64, 64x64 tile, 4 warps."""
    from cute_fa.explain import FlashLayouts

    return FlashLayouts(head_dim=64, block_m=64, block_n=64, num_threads=128, dtype="float16")
