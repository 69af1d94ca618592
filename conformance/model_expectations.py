"""Model tests a plugin is known to fail, each with its reason.

Keyed by plugin name ("*": every plugin), then by test name (the onnx
package's model test name, or a zoo model's name); see known_failures.py for
how the suite honours it.
"""

from __future__ import annotations

_PRELU_OPSET_6 = ("the model is ONNX opset 6, where PRelu's slope of shape (C,) is per channel; onnx's "
                  "version converter keeps that slope when it upgrades the model, and from opset 7 on "
                  "PRelu broadcasts the slope from the last dim (onnxruntime refuses the model too)")

EXPECTED_FAILURES: dict[str, dict[str, str]] = {
    "*": {
        "test_PReLU_1d_multiparam": _PRELU_OPSET_6,
        "test_PReLU_2d_multiparam": _PRELU_OPSET_6,
        "test_PReLU_3d_multiparam": _PRELU_OPSET_6,
    },
    "cpu": {},
}

# Tests whose outcome depends on the platform's float32 summation order, not on
# the plugin's correctness: one that fails is reported as an expected failure
# with its reason, one that passes passes (unlike EXPECTED_FAILURES, it is not
# an error for these to pass).
ORDER_DEPENDENT: dict[str, str] = {
    "test_squeezenet": (
        "the light model's weights are constants, so its final 1x1 Conv gives 1000 channels that are "
        "equal in exact arithmetic, about 1.4e10 each (a float32 ulp there is 1024); its Softmax turns "
        "any channel-to-channel rounding difference of a few ulp into outputs of 0 instead of 0.001. "
        "A GEMM whose rounding differs by output position (OpenBLAS's sgemm does on some CPUs: the "
        "channels of a 1x1 Conv of constant weights differ by 32-36 there) fails it; onnxruntime's "
        "MLAS happens to round every channel alike"),
}

