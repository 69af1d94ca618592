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

