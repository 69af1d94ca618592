"""The cpu reference plugin: C sources, built into libdevkit_cpu.so (build.py)."""

import ctypes
import functools

# The largest error of the plugin's float32 polynomials (kernels/vmath.h), in
# ulp from the float64 result rounded to float32: Exp, Tanh, Sigmoid, Erf and
# Gelu (erf form, past its atol of 2^-24; computed in float32) over every
# float32 input (scripts/vmath_exhaustive.c), Log (computed in float64) over
# every 7th float32 bit pattern (613 M inputs, both signs, subnormals,
# infinities, NaNs). docs/operators.md states each next to the op's
# tolerance; tests/test_cpu_vmath.py checks them on a sample.
FLOAT32_ULP_BOUNDS = {"Exp": 1, "Log": 1, "Tanh": 1, "Sigmoid": 2, "Erf": 1, "Gelu": 1}


@functools.cache
def preload_blas() -> None:
    """Load scipy-openblas32's OpenBLAS, which libdevkit_cpu.so links, from
    wherever the interpreter imports the package. The library's rpaths cover
    a wheel and the environment that built it; this covers the rest (a venv
    with --system-site-packages whose base has the package, a user site): a
    loaded library with the same soname satisfies the plugin's dependency.
    Without the package the rpaths are all there is, and the plugin's load
    error names the missing library."""
    try:
        import scipy_openblas32
    except ImportError:
        return
    from pathlib import Path
    library = Path(scipy_openblas32.get_lib_dir()) / f"lib{scipy_openblas32.get_library()}.so"
    if library.exists():
        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
