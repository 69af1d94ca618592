"""OpenCL C kernel sources rendered as CUDA C: the kernel library's kernel
bodies (devkit/backends/kernels), compiled by NVRTC (and by ``nvcc --ptx``
in the check) unchanged.

Two parts make one source of the other:

- ``PRELUDE``: CUDA C that gives OpenCL C's vocabulary its meaning
  (the work-item functions, ``barrier``, bit casts
  ``as_T``, ``convert_T[_sat][_rte|_rtz]``, ``vload_half`` /
  ``vstore_half_rte`` on ``cuda_fp16.h``'s half, the integer types and limits,
  ``clamp``, ``clz``, ``mul_hi``, the atomics);
- ``render``: the rewrites a macro cannot do, on address-space qualifiers
  and kernel signatures. ``kernel`` becomes ``extern "C" __global__`` and
  ``global`` goes (neither can be a macro: CUDA's ``__global__`` expands to
  an attribute named ``global``). A ``local`` or ``constant`` array becomes
  ``__shared__`` or ``__constant__``; on a pointer the qualifier goes (CUDA
  pointers are generic). A kernel parameter ``local T *name`` (pyopencl's
  ``cl.LocalMemory`` argument) becomes a byte offset into the launch's
  dynamic shared memory, where the kernel's first line points ``name``; the
  launcher passes the offsets and sizes the shared memory (kernels.py).
  ``reqd_work_group_size(x, y, z)`` becomes ``__launch_bounds__(x * y * z)``
  and OpenCL pragmas go (the sources are compiled with ``--fmad=false``,
  which is what ``FP_CONTRACT OFF`` asks for).

Nothing here imports CuPy: the check and the unit tests render and compile
sources on machines without a GPU.
"""

from __future__ import annotations

import re

# Options every source compiles with: no contraction of a * b + c into an FMA
# (the opencl programs' results round the same way), exact division and sqrt,
# and denormals kept (ONNX's float arithmetic is IEEE's, as on the host).
COMPILE_OPTIONS = ("--std=c++17", "--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false")

PRELUDE = r"""
#include <cuda_fp16.h>
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
#define CLK_LOCAL_MEM_FENCE 1
#define CLK_GLOBAL_MEM_FENCE 2
#define barrier(flags) __syncthreads()
// NVRTC 13.5 knows neither __builtin_huge_valf nor __builtin_nanf
// (nvcc's front end does): OpenCL's constants by their bits.
#undef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#undef NAN
#define NAN __int_as_float(0x7fc00000)
#ifndef CHAR_MIN
#define CHAR_MIN (-128)
#endif
#ifndef CHAR_MAX
#define CHAR_MAX 127
#endif
#ifndef UCHAR_MAX
#define UCHAR_MAX 255
#endif
#ifndef SHRT_MIN
#define SHRT_MIN (-32768)
#endif
#ifndef SHRT_MAX
#define SHRT_MAX 32767
#endif
#ifndef USHRT_MAX
#define USHRT_MAX 65535
#endif
#ifndef INT_MIN
#define INT_MIN (-2147483647 - 1)
#endif
#ifndef INT_MAX
#define INT_MAX 2147483647
#endif
#ifndef UINT_MAX
#define UINT_MAX 0xffffffffu
#endif
#ifndef LONG_MIN
#define LONG_MIN (-9223372036854775807L - 1)
#endif
#ifndef LONG_MAX
#define LONG_MAX 9223372036854775807L
#endif
#ifndef ULONG_MAX
#define ULONG_MAX 0xffffffffffffffffUL
#endif
#ifndef FLT_MAX
#define FLT_MAX 3.402823466e+38F
#endif
#ifndef DBL_MAX
#define DBL_MAX 1.7976931348623158e+308
#endif

__device__ inline ulong dk_dim(const uint3 v, uint d) { return d == 0 ? v.x : d == 1 ? v.y : v.z; }
__device__ inline ulong dk_dim(const dim3 v, uint d) { return d == 0 ? v.x : d == 1 ? v.y : v.z; }
__device__ inline ulong get_local_id(uint d) { return dk_dim(threadIdx, d); }
__device__ inline ulong get_group_id(uint d) { return dk_dim(blockIdx, d); }
__device__ inline ulong get_local_size(uint d) { return dk_dim(blockDim, d); }
__device__ inline ulong get_num_groups(uint d) { return dk_dim(gridDim, d); }
__device__ inline ulong get_global_id(uint d) { return get_group_id(d) * get_local_size(d) + get_local_id(d); }
__device__ inline ulong get_global_size(uint d) { return get_num_groups(d) * get_local_size(d); }

/* as_T: OpenCL's reinterpretation of the bits. */
template <class To, class From> __device__ inline To dk_bits(From from) {
  static_assert(sizeof(To) == sizeof(From), "as_T needs types of one size");
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}
#define as_char(x) dk_bits<char>(x)
#define as_uchar(x) dk_bits<uchar>(x)
#define as_short(x) dk_bits<short>(x)
#define as_ushort(x) dk_bits<ushort>(x)
#define as_int(x) dk_bits<int>(x)
#define as_uint(x) dk_bits<uint>(x)
#define as_long(x) dk_bits<long>(x)
#define as_ulong(x) dk_bits<ulong>(x)
#define as_float(x) dk_bits<float>(x)
#define as_double(x) dk_bits<double>(x)

/* convert_T with a rounding mode: the CUDA intrinsic of that mode. */
__device__ inline float convert_float_rte(double v) { return __double2float_rn(v); }
__device__ inline float convert_float_rtz(double v) { return __double2float_rz(v); }
__device__ inline float convert_float_rte(float v) { return v; }
__device__ inline float convert_float_rtz(float v) { return v; }
__device__ inline float convert_float_rte(long v) { return __ll2float_rn(v); }
__device__ inline float convert_float_rtz(long v) { return __ll2float_rz(v); }
__device__ inline float convert_float_rte(ulong v) { return __ull2float_rn(v); }
__device__ inline float convert_float_rtz(ulong v) { return __ull2float_rz(v); }
__device__ inline float convert_float_rte(int v) { return __int2float_rn(v); }
__device__ inline float convert_float_rtz(int v) { return __int2float_rz(v); }
__device__ inline double convert_double_rte(double v) { return v; }
__device__ inline double convert_double_rte(float v) { return v; }
__device__ inline double convert_double_rte(long v) { return __ll2double_rn(v); }
__device__ inline double convert_double_rte(ulong v) { return __ull2double_rn(v); }
__device__ inline double convert_double_rte(int v) { return v; }

/* convert_T_sat[_rtz]: out-of-range values saturate, NaN converts to 0 and
 * floats truncate toward zero (as OpenCL's default integer conversion). */
template <class To, long Low, ulong High> struct dk_sat {
  __device__ static To of(double v) {
    if (v != v) return 0;
    if (v <= (double)Low) return (To)Low;
    if (v >= (double)High) return (To)High;
    return (To)v;
  }
  __device__ static To of(float v) { return of((double)v); }
  __device__ static To of(long v) { return v < Low ? (To)Low : (High <= (ulong)LONG_MAX && v > (long)High) ? (To)High : (To)v; }
  __device__ static To of(ulong v) { return v > High ? (To)High : (To)v; }
  __device__ static To of(int v) { return of((long)v); }
  __device__ static To of(uint v) { return of((ulong)v); }
};
#define convert_char_sat(v) (dk_sat<char, CHAR_MIN, CHAR_MAX>::of(v))
#define convert_uchar_sat(v) (dk_sat<uchar, 0, UCHAR_MAX>::of(v))
#define convert_short_sat(v) (dk_sat<short, SHRT_MIN, SHRT_MAX>::of(v))
#define convert_ushort_sat(v) (dk_sat<ushort, 0, USHRT_MAX>::of(v))
#define convert_int_sat(v) (dk_sat<int, INT_MIN, INT_MAX>::of(v))
#define convert_uint_sat(v) (dk_sat<uint, 0, UINT_MAX>::of(v))
#define convert_long_sat(v) (dk_sat<long, LONG_MIN, LONG_MAX>::of(v))
#define convert_ulong_sat(v) (dk_sat<ulong, 0, ULONG_MAX>::of(v))
#define convert_int_sat_rtz convert_int_sat
#define convert_long_sat_rtz convert_long_sat
#define convert_char_sat_rtz convert_char_sat
#define convert_uchar_sat_rtz convert_uchar_sat

/* float16 storage: loads widen exactly, stores round to nearest even. */
__device__ inline float vload_half(ulong i, const half *p) { return __half2float(p[i]); }
__device__ inline void vstore_half_rte(float v, ulong i, half *p) { p[i] = __float2half_rn(v); }

template <class T, class L, class H> __device__ inline T clamp(T x, L lo, H hi) {
  return x < (T)lo ? (T)lo : x > (T)hi ? (T)hi : x;
}
__device__ inline int clz(uint x) { return __clz(x); }
__device__ inline int clz(int x) { return __clz(x); }
__device__ inline long clz(ulong x) { return __clzll(x); }
__device__ inline long clz(long x) { return __clzll(x); }
__device__ inline ulong mul_hi(ulong a, ulong b) { return __umul64hi(a, b); }
__device__ inline long mul_hi(long a, long b) { return __mul64hi(a, b); }
__device__ inline uint mul_hi(uint a, uint b) { return __umulhi(a, b); }
__device__ inline int mul_hi(int a, int b) { return __mulhi(a, b); }
/* OpenCL's atomics take volatile pointers too; CUDA's take plain ones. */
template <class T, class V> __device__ inline T atomic_xchg(volatile T *p, V v) { return atomicExch((T *)p, (T)v); }
template <class T, class V> __device__ inline T atomic_min(volatile T *p, V v) { return atomicMin((T *)p, (T)v); }
template <class T, class V> __device__ inline T atomic_max(volatile T *p, V v) { return atomicMax((T *)p, (T)v); }
template <class T, class V> __device__ inline T atomic_add(volatile T *p, V v) { return atomicAdd((T *)p, (T)v); }
template <class T, class V> __device__ inline T atomic_cmpxchg(volatile T *p, V cmp, V v) {
  return atomicCAS((T *)p, (T)cmp, (T)v);
}
/* OpenCL's isnan/isinf/isfinite of an integer convert it to float first. */
#define DK_INTEGER_CLASSIFY(T) \
  __device__ inline bool isnan(T) { return false; } \
  __device__ inline bool isinf(T) { return false; } \
  __device__ inline bool isfinite(T) { return true; }
DK_INTEGER_CLASSIFY(char)
DK_INTEGER_CLASSIFY(uchar)
DK_INTEGER_CLASSIFY(short)
DK_INTEGER_CLASSIFY(ushort)
DK_INTEGER_CLASSIFY(int)
DK_INTEGER_CLASSIFY(uint)
DK_INTEGER_CLASSIFY(long)
DK_INTEGER_CLASSIFY(ulong)
DK_INTEGER_CLASSIFY(bool)
"""

_TYPE_TOKEN = r"(?:const\s+|volatile\s+)*[A-Za-z_]\w*(?:\s+(?:const|volatile))*"
# `local T *p` / `constant T *p`: the qualifier of a pointer goes.
_POINTER_QUALIFIER = re.compile(rf"\b(?:__)?(local|constant)\s+(?={_TYPE_TOKEN}\s*\*)")
# `local T a[...]` / `constant T a[...] = {...}`: an array in shared / constant memory.
_ARRAY_QUALIFIER = re.compile(rf"\b(?:__)?(local|constant)\s+(?={_TYPE_TOKEN}\s+[A-Za-z_]\w*\s*\[)")
_MEMORY_SPACE = {"local": "__shared__ ", "constant": "__constant__ "}
_PRAGMA = re.compile(r"^[ \t]*#pragma[ \t]+OPENCL\b[^\n]*$", re.M)
_WORK_GROUP_SIZE = re.compile(r"__attribute__\s*\(\(\s*reqd_work_group_size\s*\(([^()]*)\)\s*\)\)")
_KERNEL = re.compile(r"\b(?:__)?kernel\b((?:\s+__launch_bounds__\([^()]*\))?)\s+void\s+([A-Za-z_]\w*)\s*\(")
_LOCAL_PARAMETER = re.compile(rf"^\s*(?:__)?local\s+({_TYPE_TOKEN})\s*\*\s*([A-Za-z_]\w*)\s*$")

# Not macros: CUDA's own __global__ expands to an attribute named `global`.
KERNEL = 'extern "C" __global__'
_GLOBAL = re.compile(r"\b(?:__)?global\b[ \t]*")

SHARED_ALIGNMENT = 16  # of each local-memory argument in the dynamic shared memory
_SHARED = "dk_shared_bytes"


def _matching_paren(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced parentheses in a kernel signature")


def _split_parameters(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _render_kernels(source: str) -> str:
    """Each kernel's ``local T *name`` parameters become dynamic shared memory."""
    out, at = [], 0
    for match in _KERNEL.finditer(source):
        if match.start() < at:
            continue
        open_at = match.end() - 1
        close = _matching_paren(source, open_at)
        body = source.index("{", close)
        parameters, pointers = [], []
        for parameter in _split_parameters(source[open_at + 1:close]):
            # A kernel a macro defines continues its lines with backslashes.
            local = _LOCAL_PARAMETER.match(parameter.replace("\\\n", " "))
            if local:
                ctype, name = local.groups()
                parameters.append(f" unsigned long dk_local_{name}")
                pointers.append(f" {ctype} *{name} = ({ctype} *)({_SHARED} + dk_local_{name});")
            else:
                parameters.append(parameter)
        out.append(source[at:match.start()])
        out.append(f"{KERNEL} void{match.group(1)} {match.group(2)}({','.join(parameters)}){source[close + 1:body + 1]}")
        if pointers:  # on the line of the brace, which may be inside a macro
            out.append(f" extern __shared__ __align__({SHARED_ALIGNMENT}) unsigned char {_SHARED}[];"
                       + "".join(pointers))
        at = body + 1
    out.append(source[at:])
    return "".join(out)


def _with_launch_bounds(source: str) -> str:
    """``reqd_work_group_size(x, y, z)`` as ``__launch_bounds__(x * y * z)``."""
    return _WORK_GROUP_SIZE.sub(lambda m: "__launch_bounds__(" + " * ".join(
        d.strip() for d in m.group(1).split(",")) + ")", source)


def render(source: str) -> str:
    """The CUDA C of OpenCL C ``source`` (the prelude first)."""
    text = _render_kernels(_GLOBAL.sub("", _PRAGMA.sub("", _with_launch_bounds(source))))
    text = _POINTER_QUALIFIER.sub("", text)
    text = _ARRAY_QUALIFIER.sub(lambda m: _MEMORY_SPACE[m.group(1)], text)
    # The helpers of a program are device functions.
    text = re.sub(r"^(\s*)inline\b", r"\1__device__ inline", text, flags=re.M)
    return PRELUDE + text


def defines(options: str) -> list[str]:
    """The ``-D`` definitions of OpenCL build ``options``; the rest (``-cl-*``)
    has no CUDA meaning or is what ``COMPILE_OPTIONS`` asks for anyway."""
    return [part for part in options.split() if part.startswith("-D")]


def kernel_names(source: str) -> list[str]:
    """The kernels an OpenCL C (or rendered) source defines (not those a
    macro defines from its parameter, such as ``kernel void NAME(...)``)."""
    return [m.group(2) for m in _KERNEL.finditer(_with_launch_bounds(source)) if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", m.group(2))]


def local_parameters(source: str, kernel: str) -> list[str]:
    """The names of kernel ``kernel``'s ``local`` pointer parameters, in order."""
    source = _with_launch_bounds(source)
    for match in _KERNEL.finditer(source):
        if match.group(2) == kernel:
            open_at = match.end() - 1
            params = _split_parameters(source[open_at + 1:_matching_paren(source, open_at)])
            return [m.group(2) for m in map(_LOCAL_PARAMETER.match, params) if m]
    raise KeyError(kernel)
