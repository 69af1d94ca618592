"""Kernels of devkit/ops/reduce.py: the Reduce* ops here; ArgMax, ArgMin,
Hardmax, Softmax and LogSoftmax in reduce_arg.py; CumSum in reduce_scan.py;
TopK in reduce_topk.py.

A reduction views its input as kept dims (one output each) around reduced
dims (see reduce_common). Short reductions, or enough of them to fill the
device, take one work-item per output; others a work-group per output (a
tree in local memory), and a reduction too long for one work-group
(ReduceSum of a whole large tensor) splits over several work-groups, whose
partial results a second launch combines.

Accumulators follow the cpu plugin (devkit/backends/cpu/kernels/reduce.c):
floats in double where the device has fp64 (else float), rounded once into
the dtype; integers in ulong, whose wrap-around leaves the dtype's two's
complement sums and products in the low bits; integer ReduceL2 in double
(float without fp64). ReduceLogSumExp is shift + log(sum(exp(x - shift)))
with shift the maximum where it is finite, else 0: a first reduction finds
the shifts, a second sums.
"""

from __future__ import annotations

import functools

import numpy as np

from . import reduce_arg, reduce_scan, reduce_topk
from .layer import STRIDED, Call, Tensor, cl_type, group_size, round_up
from .reduce_common import (
    build_options,
    coalesce,
    header,
    item_per_slice,
)

_SHIFT_OP = "LogSumExpShift"

# op -> (identity, item(x, aux[o]), combine(a, b), result(a, count, aux[o])),
# per accumulator type: the ops of one type share a kernel.
_FLOAT_OPS = {
    "ReduceSum": ("0", "(X_acc)x", "a + b", "a"),
    "ReduceMean": ("0", "(X_acc)x", "a + b", "a / (X_acc)count"),
    "ReduceSumSquare": ("0", "(X_acc)x * (X_acc)x", "a + b", "a"),
    "ReduceL1": ("0", "fabs((X_acc)x)", "a + b", "a"),
    "ReduceL2": ("0", "(X_acc)x * (X_acc)x", "a + b", "sqrt(a)"),
    "ReduceProd": ("1", "(X_acc)x", "a * b", "a"),
    # NaN propagates: once a is NaN nothing replaces it, and a NaN b replaces a.
    "ReduceMax": ("-INFINITY", "(X_acc)x", "b > a || isnan(b) ? b : a", "a"),
    "ReduceMin": ("INFINITY", "(X_acc)x", "b < a || isnan(b) ? b : a", "a"),
    "ReduceLogSumExp": ("0", "exp((X_acc)x - aux[o])", "a + b", "aux[o] + log(a)"),
    # ReduceLogSumExp's first pass: the maximum into aux, 0 where it is not finite.
    _SHIFT_OP: ("-INFINITY", "(X_acc)x", "b > a || isnan(b) ? b : a", None),
}
# Integers in ulong: (ulong)x keeps x's two's complement bits, whose sums
# and products wrap like the dtype's arithmetic; Max and Min compare them
# as signed.
_INT_OPS = {
    "ReduceSum": ("0", "(ulong)x", "a + b", "(X_U)a"),
    # The mean of the wrapped 64-bit sum, truncated toward zero as C divides.
    "ReduceMean": ("0", "(ulong)x", "a + b", "as_long(a) / count"),
    "ReduceSumSquare": ("0", "(ulong)x * (ulong)x", "a + b", "(X_U)a"),
    "ReduceL1": ("0", "x < 0 ? 0 - (ulong)x : (ulong)x", "a + b", "(X_U)a"),
    "ReduceProd": ("1", "(ulong)x", "a * b", "(X_U)a"),
    "ReduceMax": ("(ulong)X_MIN", "(ulong)x", "as_long(b) > as_long(a) ? b : a", "as_long(a)"),
    "ReduceMin": ("(ulong)X_MAX", "(ulong)x", "as_long(b) < as_long(a) ? b : a", "as_long(a)"),
}
# Integer ReduceL2 sums squares in R_t, the root truncated toward zero and
# saturated at the dtype's maximum.
_INT_L2 = {"ReduceL2": ("0", "(R_t)x * (R_t)x", "a + b", "sqrt(a) >= (R_t)X_MAX ? X_MAX : (long)sqrt(a)")}
# bool: False < True (opset 20).
_BOOL_OPS = {
    "ReduceMax": ("0", "(ulong)(x != 0)", "b > a ? b : a", "a"),
    "ReduceMin": ("1", "(ulong)(x != 0)", "b < a ? b : a", "a"),
}

# Stages of k_reduce: a work-item per output; `groups` work-groups per
# output, which leave their results in `part` when there are several; a
# work-group per output combining its results in `part`.
_ROWS, _GROUPS, _PARTS = 0, 1, 2

_COMMON = f"""
#define ROWS {_ROWS}
#define GROUPS {_GROUPS}
#define PARTS {_PARTS}

/* The offset of reduced element r; dims holds the nr reduced dims' shape,
 * then their strides. One multiply for the usual single coalesced dim. */
inline long reduced_offset(long r, int nr, global const long *dims) {{
  return nr == 1 ? r * dims[1] : dk_offset(r, nr, dims, dims + nr);
}}
"""

# One kernel per accumulator type, the op a kernel argument: PoCL's compile
# time grows with the code a program holds, and a kernel per op would
# repeat all of it. Only the loop over x is written out for each op (ops
# with the same loop share it): a switch per element would cost more than
# the load.
_TEMPLATE = """
inline {A} {cls}_init(int op) {{
  switch (op) {{
{init}  }}
  return 0;
}}
inline {A} {cls}_combine(int op, {A} a, {A} b) {{
  switch (op) {{
{combine}  }}
  return 0;
}}
inline void {cls}_finish(int op, {A} a, global X_t *y, long yi, long count,
    global X_acc *aux, long o) {{
  switch (op) {{
{finish}  }}
}}

/* meta: the nk kept dims' shape, strides in x, strides in y; then the nr
 * reduced dims' shape and strides in x. aux: ReduceLogSumExp's shifts. In
 * stage GROUPS, each of an output's work-groups takes `chunk` consecutive
 * elements, its work-items interleaved. Every stage runs the tree, so that
 * no barrier is conditional. */
kernel void k_reduce_{cls}(int op, int stage, global const X_t *data, long x_off,
    global X_t *y, long y_off, global const long *meta, int nk, int nr, long count, long n_out,
    long groups, long chunk, global {A} *part, global X_acc *aux) {{
  local {A} s[WG];
  int lid = get_local_id(0);
  long g = get_group_id(0), o = g, first = 0, end = 0, step = 1;
  if (stage == ROWS) {{
    o = get_global_id(0);
    end = o < n_out ? count : 0;
  }} else if (stage == GROUPS) {{
    o = g / groups;
    first = g % groups * chunk + lid;
    end = min(count, (g % groups + 1) * chunk);
    step = WG;
  }}
  long base = x_off + dk_offset(o, nk, meta, meta + nk);
  global const long *dims = meta + 3 * nk;
  {A} a = {cls}_init(op);
  switch (op) {{
{loops}  }}
  if (stage == PARTS)
    for (long j = lid; j < groups; j += WG) a = {cls}_combine(op, a, part[o * groups + j]);
  /* Work-item 0 gets the work-group's values of a combined. */
  s[lid] = a;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = WG / 2; h > 0; h >>= 1) {{
    if (lid < h) s[lid] = {cls}_combine(op, s[lid], s[lid + h]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }}
  if (stage != ROWS) {{
    if (lid != 0) return;
    a = s[0];
    if (stage == GROUPS && groups > 1) {{
      part[g] = a;
      return;
    }}
  }} else if (o >= n_out) {{
    return;
  }}
  {cls}_finish(op, a, y, y_off + dk_offset(o, nk, meta, meta + 2 * nk), count, aux, o);
}}
"""

_LOOP = """{labels}
      for (long r = first; r < end; r += step) {{
        X_ct x = X_load(data, base + reduced_offset(r, nr, dims));
        {A} b = {item};
        a = {combine};
      }}
      break;
"""


def _classes(key: int) -> dict[str, tuple[str, dict[str, tuple]]]:
    """The dtype's kernels: class name -> (accumulator type, {op: its row})."""
    t = cl_type(key)
    if t.is_float:
        return {"acc": ("X_acc", _FLOAT_OPS)}
    if t.kind == "bool":
        return {"ulong": ("ulong", _BOOL_OPS)}
    return {"ulong": ("ulong", _INT_OPS), "real": ("R_t", _INT_L2)}


@functools.cache
def _kernel_of(key: int) -> dict[str, tuple[str, int]]:
    """op -> (its kernel, its number there)."""
    return {op: (f"k_reduce_{cls}", i) for cls, (_, ops) in _classes(key).items()
            for i, op in enumerate(ops)}


@functools.cache
def _source(key: int, fp64: bool) -> str:
    parts = [header(key, fp64), _COMMON]
    for cls, (acc, ops) in _classes(key).items():
        init, combines, finishes = [], [], []
        loops: dict[tuple[str, str], list[int]] = {}  # ops of the same loop share it
        for i, (identity, item, combine, result) in enumerate(ops.values()):
            init.append(f"    case {i}: return {identity};\n")
            loops.setdefault((item, combine), []).append(i)
            combines.append(f"    case {i}: return {combine};\n")
            finish = "aux[o] = isfinite(a) ? a : 0" if result is None else f"X_put(y, yi, {result})"
            finishes.append(f"    case {i}: {finish}; break;\n")
        loop_cases = [_LOOP.format(labels="    " + " ".join(f"case {i}:" for i in numbers), A=acc,
                                   item=item, combine=combine)
                      for (item, combine), numbers in loops.items()]
        parts.append(_TEMPLATE.format(cls=cls, A=acc, init="".join(init), loops="".join(loop_cases),
                                      combine="".join(combines), finish="".join(finishes)))
    return "".join(parts)


# A row splits over several work-groups when each work-item would otherwise
# get more than _ITEMS elements, into at most about _MAX_GROUPS work-groups
# in all.
_ITEMS = 64
_MAX_GROUPS = 1024


def _reduce(c: Call, key: int, op: str, x: Tensor, y: Tensor, meta, nk: int, nr: int, count: int,
            aux) -> None:
    source, options, wg, n_out = _source(key, c.fp64), build_options(c), group_size(c), y.size
    kernel, number = _kernel_of(key)[op]

    def launch(stage: int, groups: int, chunk: int, part, global_size: int) -> None:
        c.launch(source, kernel,
                 [np.int32(number), np.int32(stage), x, np.int64(x.offset), y, np.int64(y.offset), meta,
                  np.int32(nk), np.int32(nr), np.int64(count), np.int64(n_out), np.int64(groups),
                  np.int64(chunk), part, aux], global_size, wg, options)

    if item_per_slice(c, n_out, count):
        launch(_ROWS, 1, count, None, round_up(n_out, wg))
        return
    groups = max(1, min(-(-count // (wg * _ITEMS)), _MAX_GROUPS // n_out))
    chunk = round_up(-(-count // groups), wg)
    groups = -(-count // chunk)
    part = None
    if groups > 1:  # every accumulator fits in 8 bytes
        part = c.scratch(8 * n_out * groups)
    launch(_GROUPS, groups, chunk, part, n_out * groups * wg)
    if groups > 1:
        launch(_PARTS, groups, chunk, part, n_out * wg)


def _run_reduce(c: Call, key: int) -> None:
    c.expect((1, 1), 1)
    x, y = c.inputs[0], c.outputs[0]
    if y.size == 0:
        return
    axes = c.attrs.get("axes") or []
    if axes:
        reduced = {a + x.ndim if a < 0 else a for a in axes}
    else:
        reduced = set() if c.attrs["noop_with_empty_axes"] else set(range(x.ndim))
    kept = [d for d in range(x.ndim) if d not in reduced]
    # With keepdims the output keeps x's rank; without, it has the kept dims only.
    y_strides = [y.strides[d] for d in kept] if y.ndim == x.ndim else y.strides
    kshape, (kin, kout) = coalesce([x.shape[d] for d in kept], [x.strides[d] for d in kept], y_strides)
    rshape, (rin,) = coalesce([x.shape[d] for d in sorted(reduced)], [x.strides[d] for d in sorted(reduced)])
    count = int(np.prod([x.shape[d] for d in reduced], dtype=np.int64))
    meta = c.buffer(kshape + kin + kout + rshape + rin)
    nk, nr = len(kshape), len(rshape)
    if c.op != "ReduceLogSumExp":
        _reduce(c, key, c.op, x, y, meta, nk, nr, count, None)
        return
    shift = c.scratch(8 * y.size)
    _reduce(c, key, _SHIFT_OP, x, y, meta, nk, nr, count, shift)
    _reduce(c, key, c.op, x, y, meta, nk, nr, count, shift)


UNCLAIMED: dict[tuple[str, str], str] = {}


def register(table) -> None:
    for op in (op for op in _FLOAT_OPS if op != _SHIFT_OP):
        table.claim(op, _run_reduce, STRIDED, UNCLAIMED)
    for op, run in (reduce_arg.OPS | reduce_scan.OPS | reduce_topk.OPS).items():
        table.claim(op, run, STRIDED, UNCLAIMED)
