"""cute.compile of one kernel key (needs no GPU)."""

from __future__ import annotations

import tempfile

from .fake import fake_arguments
from .keys import KernelKey
from .registry import backend_of


def compile_kernel(key: KernelKey, *, keep_ptx: bool = False):
    """cute.compile the kernel for `key` (needs no GPU); keep_ptx keeps its PTX text on the
    result (`__ptx__`)."""
    import cutlass.cute as cute

    kernel = backend_of(key).build(key)
    options = f"--gpu-arch={key.arch} --enable-tvm-ffi"
    if not keep_ptx:
        return cute.compile(kernel, *fake_arguments(key), options=options)
    with tempfile.TemporaryDirectory() as tmp:  # the PTX text stays on the result
        options += f" --keep-ptx --keep-cubin --dump-dir={tmp}"
        return cute.compile(kernel, *fake_arguments(key), options=options)
