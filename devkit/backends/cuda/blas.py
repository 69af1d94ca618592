"""MatMul's and Gemm's products through cuBLAS (cublasGemmEx and its strided
batched form), on the plan linalg_gemm.gemm makes (batch dims folded).

cuBLAS is column-major: a row-major Y = A @ B (m x n) is the column-major
Yᵀ = Bᵀ @ Aᵀ (n x m), so B is cuBLAS's first operand. A row-major operand
with unit column stride is its column-major transpose as stored (op N, the
row stride as leading dimension); one with unit row stride is stored
column-major (op T). Y needs the first form. Other layouts (both strides
above 1), integer dtypes, a Gemm whose beta is 0 with a C (IEEE's
0 * inf = NaN, which BLAS skips) and batches CUDA's grid cannot take go to
the rendered tiled kernel. Sums are float32 for float32, float16 and
bfloat16 (CUBLAS_COMPUTE_32F: no TF32, as the spec's product), float64 for
float64. The products run on the plugin's own cuBLAS handles (one per
thread and device), whose math mode forbids reductions in the output type:
by default cuBLAS may sum a split-K product's partial results in float16 or
bfloat16 (a 12288-output bfloat16 Gemm on the H200 had 44 results 2 to 5
bfloat16 ulps off), and CuPy's shared handle keeps CuPy's own mode.

``plan`` is pure arithmetic (tested without a GPU); ``gemm`` runs it.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading

import numpy as np

from ...abi import C
from ..kernels.layer import cl_type, copy
from .runtime import cuda, current_stream

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F = 68, 70
CUBLAS_DEFAULT_MATH, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 0, 16
# cudaDataType of each dtype cuBLAS multiplies here, with its compute type.
CUDA_TYPES = {C.DK_DTYPE_FLOAT32: (0, CUBLAS_COMPUTE_32F), C.DK_DTYPE_FLOAT64: (1, CUBLAS_COMPUTE_64F),
              C.DK_DTYPE_FLOAT16: (2, CUBLAS_COMPUTE_32F), C.DK_DTYPE_BFLOAT16: (14, CUBLAS_COMPUTE_32F)}
INT32_MAX = 2 ** 31 - 1  # cuBLAS's sizes and leading dimensions are ints
MAX_BATCH = 65535  # cublasGemmStridedBatchedEx's batch count runs on a grid dim of this size


def operand(rows: int, cols: int, rs: int, cs: int) -> tuple[int, int] | None:
    """(op, leading dimension) of the row-major rows x cols matrix with
    element strides (rs, cs), as the column-major cols x rows operand cuBLAS
    takes; None where neither stride is 1. A dim of size 1 takes any stride."""
    if cols == 1 or cs == 1:
        ld = rs if rows > 1 else max(1, cols)
        if ld >= max(1, cols):
            return CUBLAS_OP_N, ld
    if rows == 1 or rs == 1:
        ld = cs if cols > 1 else max(1, rows)
        if ld >= max(1, rows):
            return CUBLAS_OP_T, ld
    return None


@dataclasses.dataclass(frozen=True)
class Plan:
    """One cublasGemm(StridedBatched)Ex per index of the outer batch dims."""

    m: int                     # cuBLAS's m, n, k: the row-major product's n, m, k
    n: int
    k: int
    op_first: int              # of B, cuBLAS's first operand
    ld_first: int
    op_second: int             # of A
    ld_second: int
    ld_out: int
    strides: tuple[int, int, int]     # element strides between batched products: B, A, Y
    count: int                 # products per call
    outer: tuple[tuple[int, int, int, int], ...]  # the other batch dims: (size, a, b, y stride)


def plan(key: int, a, b, y, m: int, n: int, k: int, batch) -> Plan | None:
    """The cuBLAS calls of y = a @ b (linalg_gemm.Matrix operands, m x k @ k x n,
    ``batch`` as gemm's: (size, a stride, b stride, y stride) per dim), or None."""
    if key not in CUDA_TYPES or k == 0:
        return None
    first, second, out = operand(k, n, b.rs, b.cs), operand(m, k, a.rs, a.cs), operand(m, n, y.rs, y.cs)
    if first is None or second is None or out is None or out[0] != CUBLAS_OP_N:
        return None
    inner = batch[-1] if batch else (1, 0, 0, 0)
    if inner[0] > MAX_BATCH or max(m, n, k, first[1], second[1], out[1]) > INT32_MAX:
        return None
    return Plan(n, m, k, first[0], first[1], second[0], second[1], out[1],
                (inner[2], inner[1], inner[3]), inner[0], tuple(batch[:-1]))


_handles = threading.local()  # device index -> this thread's cuBLAS handle


def handle(device_index: int) -> int:
    """This thread's cuBLAS handle on the current device (made there once; a
    handle is not shared between threads)."""
    made = _handles.__dict__.setdefault("by_device", {})
    if device_index not in made:
        cublas = cuda().cuda.cublas
        made[device_index] = cublas.create()
        cublas.setMathMode(made[device_index],
                           CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)
    return made[device_index]


def gemm(c, key: int, a, b, y, m: int, n: int, k: int, batch, alpha: float, beta: float, addend) -> bool:
    """Runs y = alpha * a @ b (+ beta * addend) through cuBLAS when ``plan`` allows; False otherwise."""
    if addend is not None and beta == 0:
        return False
    p = plan(key, a, b, y, m, n, k, batch)
    if p is None:
        return False
    itemsize = cl_type(key).itemsize
    if addend is not None:
        # cuBLAS adds beta * Y: the addend first goes where Y is, broadcast (bit-exact).
        shape = [size for size, *_ in batch] + [m, n]
        src = (addend.offset, shape, [0] * len(batch) + [addend.rs, addend.cs])
        dst = (y.offset, shape, [dim[3] for dim in batch] + [y.rs, y.cs])
        copy(c, addend.buffer, src, y.buffer, dst, key)
    else:
        beta = 0.0
    data_type, compute = CUDA_TYPES[key]
    scalar = np.float64 if compute == CUBLAS_COMPUTE_64F else np.float32
    alpha_host, beta_host = np.array([alpha], scalar), np.array([beta], scalar)
    cublas = cuda().cuda.cublas

    def enqueue(stream) -> None:  # alpha and beta are read when the call is queued (host pointer mode)
        products = handle(c.device.index)
        # CuPy's cuBLAS calls first set the handle's stream to CuPy's current
        # stream (an explicit cublas.setStream would be overridden): ours.
        with current_stream(stream):
            for index in itertools.product(*(range(size) for size, *_ in p.outer)):
                ao = a.offset + sum(i * d[1] for i, d in zip(index, p.outer))
                bo = b.offset + sum(i * d[2] for i, d in zip(index, p.outer))
                yo = y.offset + sum(i * d[3] for i, d in zip(index, p.outer))
                pointers = [int(buffer) + offset * itemsize
                            for buffer, offset in ((b.buffer, bo), (a.buffer, ao), (y.buffer, yo))]
                cublas.gemmStridedBatchedEx(
                    products, p.op_first, p.op_second, p.m, p.n, p.k, alpha_host.ctypes.data,
                    pointers[0], data_type, p.ld_first, p.strides[0],
                    pointers[1], data_type, p.ld_second, p.strides[1],
                    beta_host.ctypes.data, pointers[2], data_type, p.ld_out, p.strides[2],
                    p.count, compute, CUBLAS_GEMM_DEFAULT)

    c.enqueue(enqueue)
    return True
