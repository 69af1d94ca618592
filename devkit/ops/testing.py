"""Case generators and the comparison that op conformance uses.

Everything is seeded: a case's inputs depend only on (op, dtype, case name).
"""

from __future__ import annotations

import dataclasses
import zlib

import ml_dtypes
import numpy as np

from .spec import ALL_FLOAT, BOOL, Tolerance, bfloat16, dtype_name


def rng_for(*names: str) -> np.random.Generator:
    """A generator seeded by names, stable across runs and processes."""
    return np.random.default_rng(zlib.crc32("/".join(names).encode()))


def is_float(dtype) -> bool:
    return np.dtype(dtype) in ALL_FLOAT


def random(rng: np.random.Generator, shape, dtype, low: float = -4.0, high: float = 4.0) -> np.ndarray:
    """Uniform values in [low, high) (integers: clipped to the dtype's range;
    bools: fair coin)."""
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    if dtype == BOOL:
        return rng.random(shape) < 0.5
    if is_float(dtype):
        return rng.uniform(low, high, shape).astype(dtype)
    info = np.iinfo(dtype)
    lo, hi = max(int(np.floor(low)), info.min), min(int(np.ceil(high)), info.max)
    return rng.integers(lo, hi, shape, endpoint=True).astype(dtype)


def finfo(dtype):
    """np.finfo that also knows bfloat16."""
    return ml_dtypes.finfo(dtype)


def special_values(dtype) -> np.ndarray:
    """Edge values of a dtype: NaN, ±inf, ±0, extremes and subnormals for
    floats; min, max, -1, 0, 1 for integers; both bools."""
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return np.array([False, True])
    if is_float(dtype):
        info = finfo(dtype)
        values = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, float(info.max), float(-info.max),
                  float(info.tiny), float(-info.tiny), float(info.smallest_subnormal), 3.0, -2.5]
        return np.array(values, dtype=np.float64).astype(dtype)
    info = np.iinfo(dtype)
    values = [info.min, info.max, 0, 1, 2, 7] + ([-1, -7] if info.min < 0 else [100])
    return np.array(values).astype(dtype)


def upcast(array):
    """What a reference gets: floating arrays as float64, others unchanged."""
    if array is None:
        return None
    array = np.asarray(array)
    return array.astype(np.float64) if is_float(array.dtype) else array


@dataclasses.dataclass
class Comparison:
    """The outcome of comparing one output with its reference."""

    ok: bool
    max_abs: float = 0.0   # largest |got - ref| over finite elements
    max_ulp: float = 0.0   # largest error in units of the output dtype's last place
    mismatches: int = 0
    message: str = ""


def _spacing(ref: np.ndarray, dtype) -> np.ndarray:
    """ULP size of the output dtype at |ref| (at least the smallest subnormal)."""
    dtype = np.dtype(dtype)
    if dtype == bfloat16:
        as32 = np.abs(ref).astype(np.float32)
        bits = as32.view(np.uint32) & np.uint32(0x7F800000)
        exponent_unit = bits.view(np.float32).astype(np.float64)
        return np.maximum(exponent_unit * 2.0 ** -7, 2.0 ** -133)
    typed = np.abs(ref).astype(dtype)
    with np.errstate(over="ignore"):
        return np.maximum(np.spacing(typed).astype(np.float64), float(np.finfo(dtype).smallest_subnormal))


def round_to(values: np.ndarray, dtype) -> np.ndarray:
    """float64 values correctly rounded (to nearest even) to a float dtype.

    NumPy converts float64 to float16 directly; bfloat16 would round twice
    (through float32), so it goes through float32 rounded to odd, which makes
    the second rounding exact."""
    dtype = np.dtype(dtype)
    if dtype != bfloat16:
        return values.astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        nearest = values.astype(np.float32)
        overshoot = np.abs(nearest.astype(np.float64)) > np.abs(values)
        truncated = np.where(overshoot, np.nextafter(nearest, np.float32(0)), nearest)
        inexact = np.isfinite(values) & (truncated.astype(np.float64) != values)
        bits = truncated.view(np.uint32) | np.where(inexact, np.uint32(1), np.uint32(0))
    return bits.view(np.float32).astype(bfloat16)


def compare(got: np.ndarray, ref: np.ndarray, tolerance: Tolerance) -> Comparison:
    """Compare a kernel's output with the (float64) reference under ``tolerance``."""
    ref = np.asarray(ref)
    if got.shape != ref.shape:
        return Comparison(False, message=f"shape {got.shape}, expected {ref.shape}")
    if got.dtype.kind in "biu":
        bad = got != ref.astype(got.dtype)
        n = int(np.count_nonzero(bad))
        if n:
            i = np.argwhere(bad)[0]
            return Comparison(False, mismatches=n, message=(
                f"{n} of {got.size} elements differ; first at {tuple(int(x) for x in i)}: "
                f"got {got[tuple(i)]!r}, expected {ref[tuple(i)]!r}"))
        return Comparison(True)
    g = got.astype(np.float64)
    # Against the reference rounded to the output dtype: "exact" means
    # correctly rounded, and ulp counts from the correctly rounded value.
    with np.errstate(over="ignore"):
        r = round_to(ref.astype(np.float64), got.dtype).astype(np.float64)
    nan_g, nan_r = np.isnan(g), np.isnan(r)
    inf_mismatch = (np.isinf(g) | np.isinf(r)) & ~(nan_g | nan_r) & (g != r)
    nan_mismatch = nan_g != nan_r
    finite = np.isfinite(g) & np.isfinite(r)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(finite, np.abs(g - r), 0.0)
        ulps = np.where(finite, diff / _spacing(np.where(finite, r, 0.0), got.dtype), 0.0)
        allowed = np.maximum(tolerance.ulp * _spacing(np.where(finite, r, 0.0), got.dtype),
                             tolerance.atol + tolerance.rtol * np.abs(np.where(finite, r, 0.0)))
    out_of_tolerance = finite & (diff > allowed)
    bad = out_of_tolerance | inf_mismatch | nan_mismatch
    max_abs = float(diff.max()) if diff.size else 0.0
    max_ulp = float(ulps.max()) if ulps.size else 0.0
    n = int(np.count_nonzero(bad))
    if n:
        i = tuple(int(x) for x in np.argwhere(bad)[0])
        return Comparison(False, max_abs, max_ulp, n, (
            f"{n} of {got.size} elements outside {tolerance} ({dtype_name(got.dtype)}); "
            f"first at {i}: got {g[i]!r}, expected {r[i]!r}; max error {max_abs:.3g} ({max_ulp:.3g} ulp)"))
    return Comparison(True, max_abs, max_ulp)
