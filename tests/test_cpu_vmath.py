"""The cpu plugin's float32 polynomials (devkit/backends/cpu/kernels/vmath.h)
against float64, over a dense sweep of float32 bit patterns.

The bound asserted is the one docs/operators.md states for each op
(devkit.backends.cpu.FLOAT32_ULP_BOUNDS: the largest error from the float64
reference rounded to float32 that scripts/vmath_exhaustive.c found over every
float32 input for Exp, Tanh, Sigmoid, Erf and Gelu's erf form (past Gelu's
atol, which its tolerance has and this test applies too), and a sweep over
every 7th float32 bit pattern found for the others). Special
values must match where the reference has them: NaN where it is NaN, the
same infinities and zeros (sign included).
"""

import math

import numpy as np
import pytest

import devkit
from devkit.backends.cpu import FLOAT32_ULP_BOUNDS
# Every 4999th float32 bit pattern (~860 K inputs spread over every binade,
# both signs, subnormals, infinities and NaNs), and every float32 in a window
# around each point where a polynomial changes form or the result overflows,
# underflows to the subnormals or to 0.
_BOUNDARIES = np.array([0.0, 0.75, 0.875, 1.0, 1.2374, 4.0, 5.657, 88.72, 87.33, 103.97,
                        float.fromhex("0x1.194f4ep+0")], dtype=np.float32)
_WINDOWS = [np.arange(b - 4096, b + 4096, dtype=np.int64)
            for b in np.concatenate([_BOUNDARIES, -_BOUNDARIES]).view(np.int32).astype(np.int64)]
SWEEP = np.concatenate([np.arange(0, 1 << 32, 4999, dtype=np.uint64).astype(np.uint32),
                        *(w.astype(np.uint32) for w in _WINDOWS)]).view(np.float32)

_erf = np.frompyfunc(math.erf, 1, 1)
_erfc = np.frompyfunc(math.erfc, 1, 1)


def _gelu_tanh(x):
    u = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-2 * u))


REFERENCES = {
    ("Exp", None): np.exp,
    ("Log", None): np.log,
    ("Tanh", None): np.tanh,
    ("Sigmoid", None): lambda x: 1 / (1 + np.exp(-x)),
    ("Erf", None): lambda x: _erf(x).astype(np.float64),
    ("Gelu", "none"): lambda x: x * 0.5 * _erfc(-x / math.sqrt(2)).astype(np.float64),
    ("Gelu", "tanh"): _gelu_tanh,
}


# The ops whose tolerance (docs/operators.md) has an atol beside its ulps.
_ATOL = {"Gelu": 2.0 ** -24}


def _ordered(x: np.ndarray) -> np.ndarray:
    """float32 as integers in the order of their values: adjacent floats differ by 1."""
    bits = x.view(np.int32).astype(np.int64)
    return np.where(bits < 0, np.int64(-(1 << 31)) - bits, bits)


@pytest.mark.parametrize("op,approximate", list(REFERENCES), ids=[f"{o}-{a}" for o, a in REFERENCES])
def test_float32_ulp_error_is_within_the_stated_bound(op, approximate):
    attrs = {} if approximate is None else {"approximate": approximate}
    x = SWEEP
    got = devkit.run_op(op, [devkit.asarray(x, devkit.device("cpu:0"))], attrs)[0].numpy()
    with np.errstate(all="ignore"):
        want = REFERENCES[op, approximate](x.astype(np.float64)).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=f"{op}: NaN where the reference is not")
    got, want, inputs = got[~nan], want[~nan], x[~nan]
    # Overflow to inf, and the values at +-0 and +-inf, bit for bit (the ulp
    # distance below does not tell -0 from +0).
    exact = ~np.isfinite(want) | (inputs == 0) | ~np.isfinite(inputs)
    np.testing.assert_array_equal(got[exact].view(np.int32), want[exact].view(np.int32),
                                  err_msg=f"{op}: infinities and signed zeros")
    ulp = np.abs(_ordered(got) - _ordered(want))
    ulp[np.abs(got.astype(np.float64) - want) <= _ATOL.get(op, 0.0)] = 0
    worst = int(np.argmax(ulp))
    assert ulp[worst] <= FLOAT32_ULP_BOUNDS[op], f"{op}({inputs[worst]!r}) = {got[worst]!r}, want {want[worst]!r}"


# A NaN with its sign bit set is what x86 arithmetic makes (inf - inf, 0 * inf): Softmax's
# x - max of a row of -inf, for one.
_NEGATIVE_NAN_PROBE = r"""
#include <stdio.h>
#include "vmath.h"
int main(void) {
  volatile double nan = -__builtin_nan("");
  volatile float nanf = -__builtin_nanf("");
  double e = vm_exp_nonpositive(nan, -746.0);
  float g = vm_gelu_tanhf(nanf);
  printf("%d %d\n", e != e, g != g);
  return 0;
}
"""


def test_exponentials_of_a_negative_nan_stay_defined(tmp_path):
    """vm_exp_nonpositive (Softmax's float64 rows) and vm_gelu_tanhf take NaN
    to NaN; with signed overflow checked (UBSan), a NaN with its sign bit set
    must not overflow the exponent arithmetic."""
    import shutil
    import subprocess
    from pathlib import Path

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip(reason="no C compiler to build the probe")
    kernels = Path(devkit.__file__).parent / "backends" / "cpu" / "kernels"
    source = tmp_path / "probe.c"
    source.write_text(_NEGATIVE_NAN_PROBE)
    binary = tmp_path / "probe"
    build = subprocess.run([compiler, "-std=c11", "-O1", "-fsanitize=signed-integer-overflow",
                            "-fno-sanitize-recover=all", f"-I{kernels}", str(source), "-o", str(binary), "-lm"],
                           capture_output=True, text=True)
    if build.returncode != 0:
        pytest.skip(reason=f"the compiler cannot build with UBSan here: {build.stderr.strip()[:200]}")
    run = subprocess.run([str(binary)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "1"]


# The transcendental unary kernels split over the pool from 8192 elements
# (UNARY_GRAIN_MATH, where a copy's loop splits from 32768): each element's
# value is its own whatever the split, so a split run, compact or strided,
# equals the same elements run in pieces too small to split, bit for bit.
@pytest.mark.parametrize("op,attrs", [("Sigmoid", {}), ("Exp", {}), ("Tanh", {}), ("Gelu", {}),
                                      ("Gelu", {"approximate": "tanh"}), ("Softplus", {})])
@pytest.mark.parametrize("size", [8191, 8192, 22016, 40000])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_split_transcendental_kernels_match_unsplit_pieces(op, attrs, size, dtype):
    dev = devkit.load_plugin("cpu").device(0)
    x = (np.random.default_rng(size).standard_normal(2 * size) * 4).astype(dtype)
    for operand in (x[:size], x[::2]):  # compact, then every other element
        (whole,) = devkit.run_op(op, [devkit.asarray(np.ascontiguousarray(operand), dev)
                                      if operand.flags.c_contiguous else devkit.asarray(x, dev)[::2]], attrs)
        pieces = [devkit.run_op(op, [devkit.asarray(np.ascontiguousarray(operand[i:i + 1000]), dev)], attrs)[0]
                  .numpy() for i in range(0, size, 1000)]
        np.testing.assert_array_equal(whole.numpy(), np.concatenate(pieces))
