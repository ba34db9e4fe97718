"""Read static CuTe layouts into numpy arrays, on the host.

Everything here runs while a `@cute.jit` function is being traced, on objects
made by the builders in this package, and turns them into plain arrays:

* a partition of an identity (coordinate) tensor — what `thr_mma.partition_C(cS)`
  returns inside a kernel — becomes the list of tile coordinates held by that
  thread, in register-slot order;
* an integer layout (a register fragment or a view of one) becomes the list of
  the register indices it addresses.

CuTe evaluates a layout at linear index i by splitting i colexicographically
over the flattened shape and summing digit * stride; strides of a coordinate
tensor are scaled basis vectors (`8@1` = 8 along mode 1). That is all this
module does; tests compare it with the DSL's own indexing.
"""

from __future__ import annotations

import numpy as np


def _flatten(tree):
    if isinstance(tree, (tuple, list)):
        out = []
        for x in tree:
            out.extend(_flatten(x))
        return out
    return [tree]


def _stride_vector(stride, rank: int) -> np.ndarray:
    vec = np.zeros(rank, dtype=np.int64)
    if isinstance(stride, int):
        if stride == 0:  # a broadcast mode: the coordinate does not move
            return vec
        if rank != 1:
            raise TypeError(f"integer stride {stride} in a rank-{rank} coordinate layout")
        vec[0] = stride
        return vec
    mode = stride.mode
    mode = mode[0] if isinstance(mode, (list, tuple)) else mode
    vec[mode] = stride.value
    return vec


def _digits(shape) -> np.ndarray:
    """(size, n_modes) digits of every linear index, colexicographic."""
    sizes = [int(s) for s in _flatten(shape)]
    total = int(np.prod(sizes)) if sizes else 1
    idx = np.arange(total)
    return np.stack(np.unravel_index(idx, sizes, order="F"), axis=1) if sizes else idx[:, None]


def coordinates(tensor, rank: int) -> np.ndarray:
    """(size, rank) tile coordinates of a partitioned identity tensor, in slot order."""
    layout = tensor.layout
    strides = np.stack([_stride_vector(s, rank) for s in _flatten(layout.stride)])
    offset = np.asarray(tensor.iterator, dtype=np.int64).reshape(rank)
    return offset + _digits(layout.shape) @ strides


def offsets(layout, rank: int) -> np.ndarray:
    """(size, rank) coordinates of a coordinate layout relative to its first element.

    Inside a kernel a thread's partition of an identity tensor is (dynamic base) +
    (static layout); this reads the static part, so per-slot coordinate offsets
    become compile-time constants.
    """
    strides = np.stack([_stride_vector(s, rank) for s in _flatten(layout.stride)])
    return _digits(layout.shape) @ strides


def indices(layout) -> np.ndarray:
    """Linear indices addressed by an integer layout, in its own index order."""
    strides = np.asarray([int(s) for s in _flatten(layout.stride)], dtype=np.int64)
    return _digits(layout.shape) @ strides


def mode_sizes(layout) -> tuple:
    """Sizes of the top-level modes: ((2,2,2),1,4) -> (8, 1, 4)."""
    return tuple(int(np.prod(_flatten(m))) for m in layout.shape)


def nested(tree):
    """A layout's shape or stride as nested Python tuples of ints."""
    if isinstance(tree, (tuple, list)):
        return tuple(nested(x) for x in tree)
    return int(tree)
