"""OpenCL kernels of devkit/ops/training.py.

This module holds the elementwise ones, which honour strides -- the
activation gradients and the optimizer updates of ai.onnx.preview.training,
a program per dtype for each -- and registers the family; the others live
in training_rows.py (SoftmaxGrad, LogSoftmaxGrad, the normalization
gradients), training_loss.py (SoftmaxCrossEntropyLoss and its gradient),
training_pool.py and training_conv.py, with what they share in
training_common.py.

Float32 computes in double where the device has fp64 and float16/bfloat16
in float, each rounded once on store; the formulas are the cpu plugin's
(devkit/backends/cpu/kernels/training.c), term for term.
"""

from __future__ import annotations

import math

import numpy as np

from . import training_conv, training_loss, training_pool, training_rows
from .layer import STRIDED, Call, launch_items, prelude
from .training_common import NO_CONTRACT, OFFSETS, acc_scalar, offsets_meta

# ---- activation gradients ------------------------------------------------------------

# dX from g (dY) and v (X or Y) in the compute type; `alpha` is LeakyRelu's.
_POINTWISE = {
    "ReluGrad": "v <= 0 ? (X_ct)0 : g",  # a NaN X passes dY through
    "LeakyReluGrad": "v > 0 ? g : alpha * g",
    "SigmoidGrad": "g * (v * ((X_ct)1 - v))",
    "TanhGrad": "g * (((X_ct)1 - v) * ((X_ct)1 + v))",
    "GeluGrad": "g * dk_gelu_derivative(v)",
    "GeluTanhGrad": "g * dk_gelu_tanh_derivative(v)",
}

_POINTWISE_TEMPLATE = """
inline X_ct dk_sigmoid(X_ct z) {
  X_ct e = exp(-fabs(z));
  return (z >= 0 ? (X_ct)1 : e) / ((X_ct)1 + e);
}

/* Phi(x) + x phi(x); x phi(x) is 0 where phi underflows (its limit, and what
 * keeps +-inf from giving inf * 0). */
inline X_ct dk_gelu_derivative(X_ct x) {
  X_ct phi = exp((X_ct)-0.5 * x * x) * (X_ct)0.39894228040143267794;
  return (X_ct)0.5 * erfc(-x * (X_ct)0.70710678118654752440) + (phi == 0 ? (X_ct)0 : x * phi);
}

/* d/dx of x sigmoid(2u), u = K (x + C x^3): sigmoid(2u) + slope sech^2(u),
 * sech^2 from e^-2|u| so that nothing overflows; 0 where it underflows. */
inline X_ct dk_gelu_tanh_derivative(X_ct x) {
  const X_ct k = (X_ct)0.79788456080286535588, c = (X_ct)0.044715;
  X_ct u = k * (x + c * x * x * x);
  X_ct e = exp((X_ct)-2 * fabs(u));
  X_ct sech2 = (X_ct)4 * e / (((X_ct)1 + e) * ((X_ct)1 + e));
  X_ct slope = (X_ct)0.5 * x * k * ((X_ct)1 + (X_ct)3 * c * x * x);
  return dk_sigmoid((X_ct)2 * u) + (sech2 == 0 ? (X_ct)0 : slope * sech2);
}

#define DK_POINTWISE(NAME, EXPR)                                                            \\
  kernel void NAME(global const X_t *dy, long dy_off, global const X_t *fwd, long fwd_off,  \\
                   global X_t *dx, long dx_off, long n, int strided, int ndim,              \\
                   global const long *meta, X_acc alpha_arg) {                              \\
    long i = get_global_id(0);                                                              \\
    if (i >= n) return;                                                                     \\
    const long base[3] = {dy_off, fwd_off, dx_off};                                         \\
    long at[3];                                                                             \\
    dk_offsets(i, strided, ndim, meta, 3, base, at);                                        \\
    X_ct alpha = (X_ct)alpha_arg, g = X_load(dy, at[0]), v = X_load(fwd, at[1]);            \\
    X_store(dx, at[2], (EXPR));                                                             \\
  }
"""


def _pointwise_source(key: int, fp64: bool) -> str:
    kernels = "".join(f"DK_POINTWISE(k_{op}, {expr})\n" for op, expr in _POINTWISE.items())
    return NO_CONTRACT + prelude("X", key, fp64) + OFFSETS + _POINTWISE_TEMPLATE + kernels


def _pointwise(c: Call, key: int) -> None:
    c.expect((2, 2), 1)
    dy, fwd = c.inputs
    (dx,) = c.outputs
    if dx.size == 0:
        return
    name = c.op
    if c.op == "GeluGrad" and c.attrs["approximate"] == "tanh":
        name = "GeluTanhGrad"
    strided, meta = offsets_meta(c, [dy, fwd, dx])
    args = [dy, np.int64(dy.offset), fwd, np.int64(fwd.offset), dx, np.int64(dx.offset),
            np.int64(dx.size), strided, np.int32(dx.ndim), meta, acc_scalar(c, c.attrs.get("alpha", 0.0))]
    launch_items(c, _pointwise_source(key, c.fp64), f"k_{name}", args, dx.size)


# ---- optimizers: Momentum, Adagrad, Adam ----------------------------------------------

# Per element, x and g read, the state read and written; `rate` is R already
# adjusted for T (Adagrad's decay, Adam's bias correction), `beta` Momentum's
# beta for this T.
_OPTIMIZER_TEMPLATE = """
#define DK_OPTIMIZER_BEGIN(COUNT)                                 \\
  long i = get_global_id(0);                                      \\
  if (i >= n) return;                                             \\
  long at[COUNT];                                                 \\
  dk_offsets(i, strided, ndim, meta, COUNT, base, at);            \\
  X_ct x = X_load(xs, at[0]), gr = (X_ct)decay * x + X_load(gs, at[1]);

kernel void k_Momentum(global const X_t *xs, global const X_t *gs, global const X_t *vs,
                       global X_t *x_new, global X_t *v_new, global const long *offsets, long n,
                       int strided, int ndim, global const long *meta, X_acc rate, X_acc alpha,
                       X_acc beta, X_acc decay, int nesterov) {
  const long base[5] = {offsets[0], offsets[1], offsets[2], offsets[3], offsets[4]};
  DK_OPTIMIZER_BEGIN(5)
  X_ct v = (X_ct)alpha * X_load(vs, at[2]) + (X_ct)beta * gr;
  X_store(v_new, at[4], v);
  X_store(x_new, at[3], nesterov ? x - (X_ct)rate * (gr + (X_ct)alpha * v) : x - (X_ct)rate * v);
}

kernel void k_Adagrad(global const X_t *xs, global const X_t *gs, global const X_t *hs,
                      global X_t *x_new, global X_t *h_new, global const long *offsets, long n,
                      int strided, int ndim, global const long *meta, X_acc rate, X_acc epsilon,
                      X_acc decay) {
  const long base[5] = {offsets[0], offsets[1], offsets[2], offsets[3], offsets[4]};
  DK_OPTIMIZER_BEGIN(5)
  X_ct h = X_load(hs, at[2]) + gr * gr;
  X_store(h_new, at[4], h);
  X_store(x_new, at[3], x - (X_ct)rate * gr / (sqrt(h) + (X_ct)epsilon));
}

kernel void k_Adam(global const X_t *xs, global const X_t *gs, global const X_t *vs,
                   global const X_t *hs, global X_t *x_new, global X_t *v_new, global X_t *h_new,
                   global const long *offsets, long n, int strided, int ndim,
                   global const long *meta, X_acc rate, X_acc alpha, X_acc beta, X_acc epsilon,
                   X_acc decay, X_acc post) {
  const long base[7] = {offsets[0], offsets[1], offsets[2], offsets[3], offsets[4], offsets[5],
                        offsets[6]};
  DK_OPTIMIZER_BEGIN(7)
  X_ct v = (X_ct)alpha * X_load(vs, at[2]) + ((X_ct)1 - (X_ct)alpha) * gr;
  X_ct h = (X_ct)beta * X_load(hs, at[3]) + ((X_ct)1 - (X_ct)beta) * (gr * gr);
  X_store(v_new, at[5], v);
  X_store(h_new, at[6], h);
  X_store(x_new, at[4], ((X_ct)1 - (X_ct)post) * (x - (X_ct)rate * (v / (sqrt(h) + (X_ct)epsilon))));
}
"""


def _optimizer_source(key: int, fp64: bool) -> str:
    return NO_CONTRACT + prelude("X", key, fp64) + OFFSETS + _OPTIMIZER_TEMPLATE


def _optimizer(c: Call, key: int) -> None:
    """Inputs X1..Xn, G1..Gn, then the state groups (V, H); outputs X_new and
    the new state, by group. One launch per optimized tensor."""
    a = c.attrs
    rate, step = float(a["R"][0]), int(a["T"][0])
    decay = a["norm_coefficient"]
    if c.op == "Momentum":
        states = 1
        scalars = [rate, a["alpha"], a["beta"] if step > 0 else 1.0, decay]
        flags = [np.int32(a["mode"] == "nesterov")]
    elif c.op == "Adagrad":
        states = 1
        scalars = [rate / (1.0 + step * a["decay_factor"]), a["epsilon"], decay]
        flags = []
    else:
        states = 2
        alpha, beta = a["alpha"], a["beta"]
        if step > 0:  # the bias correction of both moments
            rate = rate * math.sqrt(1.0 - beta ** step) / (1.0 - alpha ** step)
        scalars = [rate, alpha, beta, a["epsilon"], decay, a["norm_coefficient_post"]]
        flags = []
    groups = 2 + states
    n = len(c.inputs) // groups
    c.expect((groups * n, groups * n), (1 + states) * n)
    source = _optimizer_source(key, c.fp64)
    for i in range(n):
        read = [c.inputs[g * n + i] for g in range(groups)]
        written = [c.outputs[g * n + i] for g in range(1 + states)]
        tensors = read + written
        size = read[0].size
        if size == 0:
            continue
        strided, meta = offsets_meta(c, tensors)
        args = tensors + [c.buffer([t.offset for t in tensors]), np.int64(size), strided,
                          np.int32(read[0].ndim), meta]
        launch_items(c, source, f"k_{c.op}", args + [acc_scalar(c, v) for v in scalars] + flags, size)


# ---- registration ----------------------------------------------------------------------

UNCLAIMED: dict[tuple[str, str], str] = {}


def register(table) -> None:
    for op in ("ReluGrad", "LeakyReluGrad", "SigmoidGrad", "TanhGrad", "GeluGrad"):
        table.claim(op, _pointwise, STRIDED, UNCLAIMED)
    for op in ("Momentum", "Adagrad", "Adam"):
        table.claim(op, _optimizer, STRIDED, UNCLAIMED)
    for module in (training_rows, training_loss, training_pool, training_conv):
        module.register(table, UNCLAIMED)
