"""OpenCL kernels of devkit/ops/linalg.py: MatMul, Gemm, Conv, ConvTranspose,
Einsum, MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool.

The products share one tiled kernel template (linalg_gemm.py); Conv and
ConvTranspose run it as implicit GEMMs (linalg_conv.py), Einsum lowers to
it (linalg_einsum.py); the pools are in linalg_pool.py. This module reads
MatMul's and Gemm's calls and registers the family.
"""

from __future__ import annotations

from . import linalg_conv, linalg_einsum, linalg_pool
from .layer import STRIDED, Call, Tensor
from .linalg_gemm import Matrix, gemm

# FusedConv runs by its decomposition (Conv -> Add -> Relu), whose Add and
# Relu the fusion pass fuses into one generated kernel; the ONNX rewrite
# makes FusedConv only for plugins with a native kernel (devkit/onnx/rewrite.py).
UNCLAIMED: dict[tuple[str, str], str] = {
    ("FusedConv", dtype): "runs as Conv -> Add -> Relu, the Add and Relu fused by the codegen pass"
    for dtype in ("float32", "float64", "float16", "bfloat16")}


def _batch_strides(t: Tensor, batch_shape: list[int]) -> list[int]:
    """t's strides over the output's batch dims (0 where it broadcasts or lacks them)."""
    dims = t.shape[:-2] if t.ndim >= 2 else []
    lead = len(batch_shape) - len(dims)
    return [0] * lead + [0 if size == 1 else s for size, s in zip(dims, t.strides)]


def _matmul(c: Call, key: int) -> None:
    """NumPy's matmul: a 1-D A is one row, a 1-D B one column, and neither
    dim appears in Y; batch dims broadcast."""
    c.expect((2, 2), 1)
    a, b = c.inputs
    y = c.outputs[0]
    if y.size == 0:
        return
    m = a.shape[-2] if a.ndim >= 2 else 1
    n = b.shape[-1] if b.ndim >= 2 else 1
    nb = y.ndim - (a.ndim >= 2) - (b.ndim >= 2)
    batch_shape = y.shape[:nb]
    a_mat = Matrix(a.buffer, a.offset, *(a.strides[-2:] if a.ndim >= 2 else (0, a.strides[0])))
    b_mat = Matrix(b.buffer, b.offset, *(b.strides[-2:] if b.ndim >= 2 else (b.strides[0], 0)))
    y_mat = Matrix(y.buffer, y.offset, y.strides[nb] if a.ndim >= 2 else 0,
                   y.strides[-1] if b.ndim >= 2 else 0)
    batch = list(zip(batch_shape, _batch_strides(a, batch_shape), _batch_strides(b, batch_shape),
                     y.strides[:nb]))
    gemm(c, key, a_mat, b_mat, y_mat, m, n, a.shape[-1], batch)


def _gemm(c: Call, key: int) -> None:
    """Y = alpha * op(A) @ op(B) + beta * C: the transposes swap strides, C
    broadcasts through zero strides."""
    c.expect((2, 3), 1)
    a, b = c.inputs[:2]
    addend = c.input(2)
    y = c.outputs[0]
    if y.size == 0:
        return
    m, n = y.shape
    k = a.shape[0] if c.attrs["transA"] else a.shape[1]
    a_mat = Matrix(a.buffer, a.offset, *(a.strides[::-1] if c.attrs["transA"] else a.strides))
    b_mat = Matrix(b.buffer, b.offset, *(b.strides[::-1] if c.attrs["transB"] else b.strides))
    c_mat = None
    if addend is not None:
        shape, strides = [1, 1][addend.ndim:] + addend.shape, [0, 0][addend.ndim:] + addend.strides
        c_mat = Matrix(addend.buffer, addend.offset,
                       *(0 if size == 1 else s for size, s in zip(shape, strides)))
    gemm(c, key, a_mat, b_mat, Matrix(y.buffer, y.offset, *y.strides), m, n, k,
         alpha=c.attrs["alpha"], beta=c.attrs["beta"], addend=c_mat)


def register(table) -> None:
    table.claim("MatMul", _matmul, STRIDED, UNCLAIMED)
    table.claim("Gemm", _gemm, STRIDED, UNCLAIMED)
    linalg_conv.register(table, UNCLAIMED)
    linalg_einsum.register(table, UNCLAIMED)
    linalg_pool.register(table, UNCLAIMED)
