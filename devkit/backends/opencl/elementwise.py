"""Elementwise kernels (devkit/ops/unary.py and binary.py) from one OpenCL C
template, instantiated per op, dtype and input count.

Every input is read through its own strides over the output's shape (stride
0 where it is broadcast), so the kernels take strided and broadcast tensors
alike. float32 computes in double where the device has fp64 and rounds once
on store, which keeps the builtins' error inside the spec's ulp tolerances;
without fp64 it computes in float.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from ...abi import C
from .errors import invalid
from .kernels import CL_TYPES, STRIDED, Tensor, broadcast_strides, programs, supported_dtypes

# dtype key -> (OpenCL storage type, itemsize, integer kind's unsigned type or None)
_DTYPES = {
    C.DK_DTYPE_FLOAT32: ("float", 4, None),
    C.DK_DTYPE_FLOAT64: ("double", 8, None),
    C.DK_DTYPE_INT32: ("int", 4, "uint"),
    C.DK_DTYPE_INT64: ("long", 8, "ulong"),
}

# Unary ops: expression of x in the compute type CT. Integer forms use U, the
# unsigned type, where two's complement wrap-around is the spec's result.
_UNARY_FLOAT = {
    "Abs": "fabs(x)", "Neg": "-x", "Exp": "exp(x)", "Log": "log(x)", "Sqrt": "sqrt(x)",
    "Reciprocal": "(CT)1 / x", "Sin": "sin(x)", "Cos": "cos(x)", "Tan": "tan(x)",
    "Asin": "asin(x)", "Acos": "acos(x)", "Atan": "atan(x)", "Sinh": "sinh(x)",
    "Cosh": "cosh(x)", "Tanh": "tanh(x)", "Asinh": "asinh(x)", "Acosh": "acosh(x)",
    "Atanh": "atanh(x)", "Erf": "erf(x)", "Floor": "floor(x)", "Ceil": "ceil(x)",
    "Round": "rint(x)",  # half to even
    "Sign": "x > 0 ? (CT)1 : x < 0 ? (CT)-1 : x",  # keeps NaN and signed zeros
    "Relu": "x < 0 ? (CT)0 : x",
}
_UNARY_INT = {
    "Abs": "x < 0 ? (CT)(0 - (U)x) : x", "Neg": "(CT)(0 - (U)x)",
    "Sign": "(CT)((x > 0) - (x < 0))", "Relu": "x < 0 ? (CT)0 : x",
}
# Binary and variadic ops: f(a, b) folding the inputs left to right.
_BINARY_FLOAT = {
    "Add": "a + b", "Sub": "a - b", "Mul": "a * b", "Div": "a / b", "Sum": "a + b",
    "Max": "(a > b || isnan(a)) ? a : b", "Min": "(a < b || isnan(a)) ? a : b",
}
_BINARY_INT = {
    "Add": "(CT)((U)a + (U)b)", "Sub": "(CT)((U)a - (U)b)", "Mul": "(CT)((U)a * (U)b)",
    # x / 0 is 0; MIN / -1 wraps to MIN (its negation in U).
    "Div": "b == 0 ? (CT)0 : b == -1 ? (CT)(0 - (U)a) : a / b",
    "Max": "a > b ? a : b", "Min": "a < b ? a : b",
    "BitwiseAnd": "a & b", "BitwiseOr": "a | b", "BitwiseXor": "a ^ b",
}
_VARIADIC = {"Sum", "Max", "Min"}

_TEMPLATE = """{pragma}
typedef {T} T;
typedef {CT} CT;
{unsigned}
inline CT op(CT a, CT b) {{ return {binary}; }}
inline CT op1(CT x) {{ return {unary}; }}

/* meta: the output shape, then each tensor's strides over it (output last). */
kernel void elementwise({params}global T *y, long y_off, int ndim,
                        global const long *meta, long n) {{
  long i = get_global_id(0);
  if (i >= n) return;
  long rest = i, iy = y_off{offsets};
  for (int d = ndim - 1; d >= 0; --d) {{
    long k = rest % meta[d];
    rest /= meta[d];
    iy += k * meta[{n_in} * ndim + ndim + d];{steps}
  }}
  {body}
}}
"""


def _source(dtype_key: int, fp64: bool, n_inputs: int, unary: str | None, binary: str | None) -> str:
    storage, _, unsigned = _DTYPES[dtype_key]
    compute = "double" if storage == "double" or (storage == "float" and fp64) else storage
    params = "".join(f"global const T *x{j}, long x{j}_off, " for j in range(n_inputs))
    offsets = "".join(f", i{j} = x{j}_off" for j in range(n_inputs))
    steps = "".join(f"\n    i{j} += k * meta[ndim + {j} * ndim + d];" for j in range(n_inputs))
    if unary is not None:
        body = "y[iy] = (T)op1((CT)x0[i0]);"
    else:
        fold = "(CT)x0[i0]"
        for j in range(1, n_inputs):
            fold = f"op({fold}, (CT)x{j}[i{j}])"
        body = f"y[iy] = (T){fold};"
    return _TEMPLATE.format(
        pragma="#pragma OPENCL EXTENSION cl_khr_fp64 : enable" if compute == "double" else "",
        T=storage, CT=compute, unsigned=f"typedef {unsigned} U;" if unsigned else "",
        binary=binary or "a", unary=unary or "x", params=params, offsets=offsets, steps=steps,
        n_in=n_inputs, body=body)


class _Kernel:
    """One (op, dtype) entry: builds its programs per device and input count."""

    def __init__(self, op: str, dtype_key: int, device_of, unary=None, binary=None):
        self.op, self.dtype_key, self.device_of = op, dtype_key, device_of
        self.unary, self.binary = unary, binary
        self.itemsize = _DTYPES[dtype_key][1]

    def __call__(self, call):
        device = self.device_of(call.device)
        stream = device.stream(call.stream)  # the host may pass NULL: then it runs now
        n_inputs = call.num_inputs
        if self.unary is not None and n_inputs != 1:
            raise invalid(f"{self.op} takes 1 input, got {n_inputs}")
        if self.unary is None and (n_inputs < 1 if self.op in _VARIADIC else n_inputs != 2):
            raise invalid(f"{self.op} takes {'1 or more' if self.op in _VARIADIC else 2} inputs, "
                          f"got {n_inputs}")
        if call.num_outputs != 1:
            raise invalid(f"{self.op} has 1 output, got {call.num_outputs}")
        inputs = [Tensor(device, f"input {j}", call.inputs[j], self.itemsize) for j in range(n_inputs)]
        output = Tensor(device, "output 0", call.outputs[0], self.itemsize)
        shape = output.shape
        if output.size == 0:
            return
        meta = np.array(shape + [s for t in inputs for s in broadcast_strides(t, shape)]
                        + output.strides + [0], np.int64)  # never empty, even for rank 0
        source = _source(self.dtype_key, device.fp64, n_inputs, self.unary, self.binary)
        kernel = cl.Kernel(programs.get(device, source), "elementwise")
        meta_buffer = cl.Buffer(device.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                                hostbuf=meta)
        args = [a for t in inputs for a in (t.mem.buffer, np.int64(t.offset))]
        args += [output.mem.buffer, np.int64(output.offset), np.int32(len(shape)), meta_buffer,
                 np.int64(output.size)]
        kernel.set_args(*args)
        device.submit(stream, lambda q: cl.enqueue_nd_range_kernel(q, kernel, (output.size,), None))


UNCLAIMED = {("Tan", "float64"): "OpenCL allows tan 5 ulp and PoCL's double tan is 2 ulp from the "
                                  "correctly rounded result, outside the spec's 1 ulp for float64 Tan"}


def register(table) -> None:
    """Adds every elementwise (op, dtype) the devices all support."""
    for key in (C.DK_DTYPE_FLOAT32, C.DK_DTYPE_FLOAT64, C.DK_DTYPE_INT32, C.DK_DTYPE_INT64):
        if key == C.DK_DTYPE_FLOAT64 and not all(d.fp64 for d in table.devices):
            continue
        is_float = _DTYPES[key][2] is None
        for op, text in (_UNARY_FLOAT if is_float else _UNARY_INT).items():
            if key in supported_dtypes(op, table.devices) and (op, CL_TYPES[key].name) not in UNCLAIMED:
                table.add(op, key, _Kernel(op, key, table.device_of, unary=text), STRIDED)
        for op, text in (_BINARY_FLOAT if is_float else _BINARY_INT).items():
            if key in supported_dtypes(op, table.devices):
                table.add(op, key, _Kernel(op, key, table.device_of, binary=text), STRIDED)
