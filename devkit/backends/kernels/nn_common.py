"""What the kernels of nn.py and nn_attention.py share: X_acc arguments and
local memory, work-group launches, and the work-group reductions in OpenCL C."""

from __future__ import annotations

import numpy as np

from .layer import Local, group_size

# Work-group reductions over X_acc: each returns the combination of every
# work-item's v to each of them. scratch holds get_local_size(0) values, a
# power of two, and is free again on return. Tree order keeps a sum's error
# near log2 of the group size on top of each work-item's own partial sum.
GROUP_REDUCE = """
#define NN_GROUP_REDUCE(NAME, COMBINE)                                   \\
inline X_acc NAME(local X_acc *scratch, X_acc v) {                       \\
  size_t lid = get_local_id(0);                                          \\
  scratch[lid] = v;                                                      \\
  for (size_t span = get_local_size(0) / 2; span > 0; span /= 2) {       \\
    barrier(CLK_LOCAL_MEM_FENCE);                                        \\
    if (lid < span) scratch[lid] = COMBINE(scratch[lid], scratch[lid + span]); \\
  }                                                                      \\
  barrier(CLK_LOCAL_MEM_FENCE);                                          \\
  X_acc total = scratch[0];                                              \\
  barrier(CLK_LOCAL_MEM_FENCE);                                          \\
  return total;                                                          \\
}
#define NN_ADD(a, b) ((a) + (b))
/* NaN-propagating, unlike fmax. */
#define NN_MAX(a, b) ((a) > (b) || isnan(a) ? (a) : (b))
NN_GROUP_REDUCE(nn_group_sum, NN_ADD)
NN_GROUP_REDUCE(nn_group_max, NN_MAX)
"""


def acc(c, value: float):
    """A float kernel argument of type X_acc (double where the device has fp64)."""
    return np.float64(value) if c.fp64 else np.float32(value)


def local_acc(c, size: int) -> Local:
    """Local memory for ``size`` X_acc values."""
    return Local(size * (8 if c.fp64 else 4))


def tensor_args(*tensors) -> list:
    """The (buffer, element offset) kernel arguments of each tensor."""
    return [a for t in tensors for a in (t, np.int64(t.offset))]


def launch_groups(c, source: str, name: str, args: list, groups: int) -> None:
    """Launches reduction kernel ``name`` with ``groups`` work-groups, if
    any, appending its local scratch argument to ``args``."""
    if groups == 0:
        return
    local = group_size(c)
    c.launch(source, name, args + [local_acc(c, local)], groups * local, local)


def count(shape, start: int = 0, stop: int | None = None) -> int:
    """The number of elements of dims [start, stop) of ``shape``."""
    return int(np.prod(shape[start:stop], dtype=np.int64))
