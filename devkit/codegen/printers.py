"""The dialect printers: everything that differs between C, OpenCL C and
CUDA C when an expression rule (rules.py) or a generated kernel (render.py)
is written out — type names, math function names, literals, qualifiers,
half types and the work-item index. Rules never name a dialect."""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dtypes

_FLOAT_MATH = ("exp", "log", "log1p", "sqrt", "tanh", "erf", "sin", "cos", "atan", "floor", "ceil", "pow",
               "fabs", "fmod", "round", "trunc")


def _suffixed(name: str, dtype: np.dtype) -> str:
    """C's and CUDA's name of a math function below float64: expf for exp."""
    return name + "f" if name in _FLOAT_MATH and dtype != np.float64 else name


# Float32 functions computed in double and rounded once, as dk_<name>f:
# the float versions at hand are up to 2 ulp off (glibc's vector sinf, cosf
# and atanf; PoCL's and CUDA's sin and cos, CUDA's atanf), over the ops' 1;
# the double ones (4 ulp of a double at most) round to within 1 ulp of the
# float32 result.
_THROUGH_DOUBLE = ("sin", "cos", "atan")


def _through_double(qualifier: str) -> str:
    """The dk_<name>f definitions of _THROUGH_DOUBLE, each function prefixed by ``qualifier``."""
    return "".join(f"{qualifier}float dk_{f}f(float x) {{ return (float){f}((double)x); }}\n"
                   for f in _THROUGH_DOUBLE)


def _simd_declarations(unary: tuple, binary: tuple) -> str:
    """C declarations of the float and double math functions named, marked as having SIMD variants."""
    return "".join(f'__attribute__((__simd__("notinbranch"))) {t} {f}{s}({", ".join([t] * arity)});\n'
                   for t, s in (("float", "f"), ("double", "")) for names, arity in ((unary, 1), (binary, 2))
                   for f in names)


class Printer:
    """One dialect. ``storage`` types are what tensors hold, ``compute``
    types what expressions compute in (float16 and bfloat16 compute in
    float)."""

    dialect = ""
    storage_types: dict[str, str] = {}
    # the qualifier of a tensor pointer parameter, and of a const one
    global_qualifier = ""
    prologue = ""

    def storage(self, dtype) -> str:
        name = _dtypes.normalize(dtype).name if _dtypes.normalize(dtype) != _dtypes.bfloat16 else "bfloat16"
        try:
            return self.storage_types[name]
        except KeyError:
            raise NotImplementedError(f"{self.dialect}: no storage type for {name}") from None

    def compute(self, dtype) -> str:
        dtype = _dtypes.normalize(dtype)
        if dtype == np.float64:
            return "double"
        if dtype.kind == "f" or dtype == _dtypes.bfloat16:
            return "float"
        return {"bool": "int", "int32": "int", "int64": self.storage_types["int64"]}.get(dtype.name) or \
            self.storage(dtype)

    def call(self, name: str, dtype, *args: str) -> str:
        """A math function at the compute type of ``dtype``: float32's
        _THROUGH_DOUBLE ones as dk_<name>f, which every prologue defines."""
        dtype = _dtypes.normalize(dtype)
        function = f"dk_{name}f" if name in _THROUGH_DOUBLE and dtype == np.float32 else self.math_name(name, dtype)
        return f"{function}({', '.join(args)})"

    def math_name(self, name: str, dtype: np.dtype) -> str:
        return name

    def literal(self, value, dtype) -> str:
        dtype = _dtypes.normalize(dtype)
        if dtype.kind == "b":
            return "1" if value else "0"
        if dtype.kind in "iu":
            return f"(({self.compute(dtype)}){int(value)})"
        value = float(value)
        if np.isnan(value):
            return f"(({self.compute(dtype)})NAN)"
        if np.isinf(value):
            return f"(({self.compute(dtype)}){'-' if value < 0 else ''}INFINITY)"
        text = repr(value)
        if "e" not in text and "." not in text:
            text += ".0"
        return text + ("f" if self.compute(dtype) == "float" else "")

    def cast(self, expression: str, dtype) -> str:
        return f"(({self.compute(dtype)})({expression}))"

    def load(self, pointer: str, offset: str, dtype) -> str:
        """An element read, converted to the compute type."""
        return self.cast(f"{pointer}[{offset}]", dtype)

    def store(self, pointer: str, offset: str, value: str, dtype) -> str:
        dtype = _dtypes.normalize(dtype)
        if dtype.kind == "b":
            value = f"(({value}) != 0)"
        return f"{pointer}[{offset}] = ({self.storage(dtype)})({value});"

    # -- kernels (render.py fills in the body) -----------------------------------

    def signature(self, name: str, params: list[tuple[str, str, bool]]) -> tuple[str, list[str]]:
        """(the function's first line, the lines that bind each tensor
        parameter's pointer); params are (name, storage type, is_output)."""
        raise NotImplementedError

    def item_loop(self, var: str) -> tuple[list[str], list[str]]:
        """The lines that open and close the loop over this call's work items."""
        raise NotImplementedError

    def checked(self) -> Printer | None:
        """A printer of this dialect whose math calls take a fast path that
        holds over part of their domain and flag an argument outside it
        (``checked_blocks`` then reruns the block with the plain calls);
        None where the dialect has none."""
        return None

    def checked_blocks(self, fast: list[str], accurate: list[str]) -> list[str]:
        """The loops ``fast`` (written by ``checked()``'s printer) over each
        block of the call's items, and ``accurate`` over a block in which a
        checked call was flagged."""
        raise NotImplementedError

    def reduction_loop(self, acc: str, ctype: str, init: str, n: int, body: list[str], value: str,
                       combine) -> list[str]:
        """The lines that declare ``acc`` (``ctype``, from ``init``) and fold
        a row's ``n`` columns into it: for each column ``j``, ``body``
        defines ``value`` and ``combine(a, b)`` is the expression folding b
        into a. Here one loop in column order."""
        return [f"{ctype} {acc} = {init};", f"for (long j = 0; j < {n}; j++) {{",
                *("  " + line for line in body), f"  {acc} = {combine(acc, value)};", "}"]

    def row_chunk_loop(self, row: str, column: str, width: int) -> tuple[list[str], list[str]] | None:
        """For a dialect whose call runs a chunk of elements in a loop: the
        lines that open and close that loop as rows of ``width`` (``row``)
        and an inner loop over their columns (``column``), so a tensor
        broadcast along the rows is read at a plain offset the compiler can
        vectorise; None where a work item is one element."""
        return None


# float32 exps for the C dialect in operations GCC vectorises with no call
# (glibc's vector expf is 2 ulp from the rounded result at some inputs, over
# the Exp op's 1): x = k ln2 + r, |r| <= ln2 / 2 (k from the shifter, ln2 in
# two parts, each step one fused multiply-add), e^r by a degree-6
# polynomial in Horner form, one FMA a step (fitted to e^r's relative
# error over |r| <= ln2 / 2, below 2^-28.9; its r coefficient is 1), then 2^k.
# dk_expf takes every input: x clamped to [-104, 89] (NaN stays NaN; e^-104
# rounds to 0 and e^89 to inf) and 2^k as two normal factors, so results
# down to the subnormals round once. dk_expf_checked, the elementwise
# kernels' (about 1.5x the throughput of glibc's vector expf on AVX2), adds
# k to the exponent bits, which holds where e^x is a normal float: |x| <= 86;
# an argument outside (larger, infinite or NaN) sets *slow, and the kernel
# reruns the block with dk_expf (checked_blocks). Every float32 checked
# (scripts/codegen_exp_exhaustive.py): at most 1 ulp from the float64 result
# rounded to float32, as vmath.h's vm_expf. Without hardware FMA both are
# libm's expf.
_C_MATH = """\
typedef union { float f; uint32_t u; } dk_f32; /* a float's bits: (dk_f32){.f = x}.u, and back */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
/* e^r for x = k ln2 + r; k is in the low bits of *t (whose own are 0x4b400000). */
static inline float dk_expf_reduced(float x, float *t) {
  const float shifter = 0x1.8p23f; /* adding it rounds to an integer in the low bits */
  *t = __builtin_fmaf(x, 0x1.715476p0f, shifter);
  float k = *t - shifter;
  float r = __builtin_fmaf(k, -0x1.62e430p-1f, x);
  r = __builtin_fmaf(k, 0x1.05c610p-29f, r);
  float p = __builtin_fmaf(0x1.6ae70ap-10f, r, 0x1.126782p-7f);
  p = __builtin_fmaf(p, r, 0x1.555822p-5f);
  p = __builtin_fmaf(p, r, 0x1.55541ap-3f);
  p = __builtin_fmaf(p, r, 0x1.fffffcp-2f);
  p = __builtin_fmaf(p, r, 1.0f);
  return __builtin_fmaf(p, r, 1.0f);
}
static inline float dk_expf(float x) {
  float xc = x < -104.0f ? -104.0f : x; /* NaN stays NaN */
  xc = xc > 89.0f ? 89.0f : xc;
  float t, y = dk_expf_reduced(xc, &t);
  int32_t k = (int32_t)((dk_f32){.f = t}.u - 0x4b400000u), h = k >> 1; /* k in [-150, 128] */
  return y * (dk_f32){.u = (uint32_t)(h + 127) << 23}.f * (dk_f32){.u = (uint32_t)(k - h + 127) << 23}.f;
}
/* *slow takes -1, not 1: the vector compare's mask as it is. And t's bits
 * shifted by 23 are k's, 0x4b400000 << 23 being 0 in 32 bits. (Each saved
 * one vector op, and together 30% of the exp's time, on AVX2.) */
static inline float dk_expf_checked(float x, int *slow) {
  *slow |= fabsf(x) <= 86.0f ? 0 : -1;
  float t, y = dk_expf_reduced(x, &t);
  return (dk_f32){.u = (dk_f32){.f = y}.u + ((dk_f32){.f = t}.u << 23)}.f;
}
#else
static inline float dk_expf(float x) { return expf(x); }
static inline float dk_expf_checked(float x, int *slow) { (void)slow; return expf(x); }
#endif
/* ln x in float32, as vmath.h's vm_logf (at most 1 ulp): x = 2^k m with m
 * in [sqrt(1/2), sqrt(2)) (subnormals scaled up first), ln m = 2 atanh(s),
 * s = (m - 1) / (m + 1), by its series to s^13 / 13 in double. glibc's
 * vector logf is not used: up to 4 ulp off, over Log's tolerance. */
static inline float dk_logf(float x) {
  float xs = x < 0x1p-126f ? x * 0x1p23f : x; /* subnormal or 0: exact */
  uint32_t ix = (dk_f32){.f = xs}.u + (0x3f800000u - 0x3f3504f3u);
  int32_t k = (x < 0x1p-126f ? -23 : 0) + (int32_t)(ix >> 23) - 0x7f;
  float m = (dk_f32){.u = (ix & 0x007fffffu) + 0x3f3504f3u}.f;
  double f = (double)m - 1.0, s = f / (2.0 + f), z = s * s;
  double p = 1.0 / 13;
  p = p * z + 1.0 / 11;
  p = p * z + 1.0 / 9;
  p = p * z + 1.0 / 7;
  p = p * z + 1.0 / 5;
  p = p * z + 1.0 / 3;
  p = p * z + 1.0;
  float y = (float)((double)k * 0x1.62e42fefa39efp-1 + 2.0 * s * p);
  y = x == 0 ? -INFINITY : y;
  y = x < 0 ? NAN : y;
  return x == INFINITY || x != x ? x + x : y; /* a signalling NaN comes back quiet */
}
/* erf x in float32, as vmath.h's vm_erff (at most 1 ulp measured): below
 * |x| = 7/8 x + x R(x^2), a fit of erf(sqrt z) / sqrt z - 1; beyond,
 * 1 - e^Q(|x|), Q a fit of ln erfc over [7/8, 4], and 1 from 4 on. glibc's
 * vector erff is not used: its AVX-512 variant is 4 ulp off near 1. */
static inline float dk_erff(float x) {
  float a = fabsf(x), z = x * x;
  float p = 8.714060095371678e-05f;
  p = p * z - 0.0008220518357120454f;
  p = p * z + 0.005207621492445469f;
  p = p * z - 0.026861969381570816f;
  p = p * z + 0.11283741146326065f;
  p = p * z - 0.37612637877464294f;
  p = p * z + 0.12837916612625122f;
  float t = a < 0.875f ? 0.875f : a;
  t = t > 4.0f ? 4.0f : t;
  float q = 1.6054320894909324e-06f;
  q = q * t - 4.541504313237965e-05f;
  q = q * t + 0.0005912453634664416f;
  q = q * t - 0.004732866305857897f;
  q = q * t + 0.026343179866671562f;
  q = q * t - 0.10993916541337967f;
  q = q * t - 0.6319798827171326f;
  q = q * t - 1.1301409006118774f;
  q = q * t + 0.00029666503542102873f;
  float erfc = a > 4.0f ? 0.0f : dk_expf(q);
  return a < 0.875f ? x + x * p : copysignf(1.0f - erfc, x);
}
"""
# Items per block of a checked kernel: a rerun finds its inputs in L1.
_C_CHECKED_BLOCK = 1024


# The C dialect's row reductions fold into this many lanes (see
# CPrinter.reduction_loop): four AVX-512 or eight AVX2 vector accumulators.
REDUCTION_LANES = 64


class CPrinter(Printer):
    """ISO C11 for the cpu plugin: ``void NAME(void *const *args, int64_t begin, int64_t end)``."""

    dialect = "c"
    storage_types = {"float32": "float", "float64": "double", "float16": "_Float16", "int8": "int8_t",
                     "int16": "int16_t", "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t",
                     "bool": "uint8_t"}
    # glibc's libmvec (x86-64) has SIMD variants of these (exp, log, sin, cos
    # and pow since 2.22; tanh, erf and atan since 2.35); declared so, GCC
    # vectorises loops that call them (it does by itself only under -ffast-math).
    prologue = ("#include <math.h>\n#include <stdint.h>\n"
                "#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__)\n"
                + _simd_declarations(("exp", "log", "sin", "cos"), ("pow",))
                + "#if __GLIBC_PREREQ(2, 35)\n" + _simd_declarations(("tanh", "erf", "atan"), ()) + "#endif\n"
                + "#endif\n" + _C_MATH + _through_double("static inline "))

    def math_name(self, name: str, dtype: np.dtype) -> str:
        if name in ("exp", "erf", "log") and dtype == np.float32:
            return f"dk_{name}f"
        return _suffixed(name, dtype)

    def checked(self):
        return _CheckedCPrinter()

    def checked_blocks(self, fast, accurate):
        n = _C_CHECKED_BLOCK
        return [f"  for (int64_t block = begin; block < end; block += {n}) {{",
                f"    const int64_t block_end = end - block < {n} ? end : block + {n};",
                "    {",
                "      const int64_t begin = block, end = block_end; /* the loops below run over the block */",
                "      int slow = 0;",
                *("    " + line for line in fast),
                "      if (slow) {",
                *("      " + line for line in accurate),
                "      }",
                "    }",
                "  }"]

    def signature(self, name, params):
        lines = [f"{'const ' if not out else ''}{ctype} *restrict {p} = "
                 f"({'const ' if not out else ''}{ctype} *)args[{k}];"
                 for k, (p, ctype, out) in enumerate(params)]
        return f"void {name}(void *const *args, int64_t begin, int64_t end)", lines

    def item_loop(self, var):
        return [f"for (int64_t {var} = begin; {var} < end; {var}++) {{"], ["}"]

    def reduction_loop(self, acc, ctype, init, n, body, value, combine):
        # REDUCTION_LANES partial folds, column j into lane j % lanes, then
        # the lanes folded in order: one accumulator would make the loop one
        # chain of dependent adds (4 cycles each), the vectorised lanes are
        # independent chains. (The kernels are compiled with
        # -fassociative-math, which already lets the sum's order change.)
        lanes = REDUCTION_LANES
        if n < 2 * lanes:
            return super().reduction_loop(acc, ctype, init, n, body, value, combine)
        part, full = f"{acc}_lanes", n - n % lanes
        lines = [f"{ctype} {acc} = {init};", "{",
                 f"  {ctype} {part}[{lanes}];",
                 f"  for (int l = 0; l < {lanes}; l++) {part}[l] = {init};",
                 f"  for (long block = 0; block < {full}; block += {lanes})",
                 f"    for (int l = 0; l < {lanes}; l++) {{",
                 "      const long j = block + l;",
                 *("      " + line for line in body),
                 f"      {part}[l] = {combine(f'{part}[l]', value)};",
                 "    }"]
        if full < n:
            lines += [f"  for (long j = {full}; j < {n}; j++) {{", *("    " + line for line in body),
                      f"    {part}[0] = {combine(f'{part}[0]', value)};", "  }"]
        return lines + [f"  for (int l = 0; l < {lanes}; l++) {acc} = {combine(acc, f'{part}[l]')};", "}"]

    def row_chunk_loop(self, row, column, width):
        return ([f"for (int64_t item = begin; item < end;) {{",
                 f"  int64_t {row} = item / {width}, first = item - {row} * {width};",
                 f"  int64_t stop = end - item < {width} - first ? first + (end - item) : {width};",
                 f"  for (int64_t {column} = first; {column} < stop; {column}++) {{"],
                ["  }", f"  item = {row} * {width} + stop;", "}"])


class _CheckedCPrinter(CPrinter):
    """The C printer whose float32 exp is dk_expf_checked; ``used`` says
    whether a kernel it wrote calls it."""

    def __init__(self):
        self.used = False

    def call(self, name, dtype, *args):
        if name == "exp" and _dtypes.normalize(dtype) == np.float32:
            self.used = True
            return f"dk_expf_checked({args[0]}, &slow)"
        return super().call(name, dtype, *args)

    def checked(self):
        return None


class OpenCLPrinter(Printer):
    """OpenCL C 1.2: a __kernel whose tensor parameters are (buffer, byte offset) pairs."""

    dialect = "opencl-c"
    storage_types = {"float32": "float", "float64": "double", "float16": "half", "int8": "char",
                     "int16": "short", "int32": "int", "int64": "long", "uint8": "uchar", "bool": "uchar"}
    # without fp64 (the extension undeclared), dk_<name>f are the float functions
    prologue = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n#ifdef cl_khr_fp64\n" + _through_double("static inline ")
                + "#else\n" + "".join(f"#define dk_{f}f {f}\n" for f in _THROUGH_DOUBLE) + "#endif\n")

    def load(self, pointer, offset, dtype):
        if _dtypes.normalize(dtype) == np.float16:  # half is storage-only without cl_khr_fp16
            return f"vload_half({offset}, {pointer})"
        return super().load(pointer, offset, dtype)

    def store(self, pointer, offset, value, dtype):
        if _dtypes.normalize(dtype) == np.float16:
            return f"vstore_half({value}, {offset}, {pointer});"
        return super().store(pointer, offset, value, dtype)

    def signature(self, name, params):
        args = ", ".join(f"__global {'const ' if not out else ''}{ctype} *{p}_buffer, ulong {p}_offset"
                         for p, ctype, out in params)
        lines = [f"__global {'const ' if not out else ''}{ctype} *{p} = (__global {'const ' if not out else ''}"
                 f"{ctype} *)((__global {'const ' if not out else ''}char *){p}_buffer + {p}_offset);"
                 for p, ctype, out in params]
        return f"__kernel void {name}({args})", lines

    def item_loop(self, var):
        return [f"{{ long {var} = get_global_id(0);"], ["}"]


class CudaPrinter(Printer):
    """CUDA C++: an extern "C" __global__ function taking pointers to element 0."""

    dialect = "cuda-c"
    storage_types = {"float32": "float", "float64": "double", "float16": "__half", "bfloat16": "__nv_bfloat16",
                     "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
                     "uint8": "unsigned char", "bool": "unsigned char"}
    prologue = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n" + _through_double("__device__ inline ")

    def math_name(self, name, dtype):
        return _suffixed(name, dtype)

    def literal(self, value, dtype):
        text = super().literal(value, dtype)
        return text.replace("NAN", "__int_as_float(0x7fffffff)").replace("INFINITY", "__int_as_float(0x7f800000)")

    def signature(self, name, params):
        args = ", ".join(f"{'const ' if not out else ''}{ctype} *__restrict__ {p}" for p, ctype, out in params)
        return f'extern "C" __global__ void {name}({args}, long long items)', []

    def item_loop(self, var):
        return [f"for (long long {var} = blockIdx.x * (long long)blockDim.x + threadIdx.x; {var} < items; "
                f"{var} += (long long)gridDim.x * blockDim.x) {{"], ["}"]


PRINTERS = {p.dialect: p for p in (CPrinter(), OpenCLPrinter(), CudaPrinter())}


def printer(dialect: str) -> Printer:
    try:
        return PRINTERS[dialect]
    except KeyError:
        raise NotImplementedError(f"no printer for dialect {dialect!r} (devkit writes {', '.join(PRINTERS)})") \
            from None
