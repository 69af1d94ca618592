"""The cpu reference plugin: C sources, built into libdevkit_cpu.so (build.py)."""

# The largest error of the plugin's float32 polynomials (kernels/vmath.h), in
# ulp from the float64 result rounded to float32: Exp, Tanh, Sigmoid, Erf and
# Gelu (erf form, past its atol of 2^-24; computed in float32) over every
# float32 input (scripts/vmath_exhaustive.c), Log (computed in float64) over
# every 7th float32 bit pattern (613 M inputs, both signs, subnormals,
# infinities, NaNs). docs/operators.md states each next to the op's
# tolerance; tests/test_cpu_vmath.py checks them on a sample.
FLOAT32_ULP_BOUNDS = {"Exp": 1, "Log": 1, "Tanh": 1, "Sigmoid": 2, "Erf": 1, "Gelu": 1}

