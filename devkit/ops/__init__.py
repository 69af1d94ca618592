"""devkit's operator set: the spec of every op, and every op as a function.

``devkit.ops.Conv(x, w, b, strides=[2, 2])`` runs ONNX's Conv on the device
of ``x``; ops with several outputs return a tuple. ``devkit.run_op(name,
inputs, attrs)`` is the generic form. See docs/operators.md.
"""

from __future__ import annotations

import importlib

from .dispatch import (call_cache_info, clear_call_cache, cpu_fallback, fallback_enabled, fallback_report, infer,
                       run_op, set_fallback)
from .spec import OpSpec, all_specs, get

# One module per op family; importing one registers its specs.
FAMILIES = ("unary", "binary", "reduce", "linalg", "nn", "movement", "shape", "training")
for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")


def _op_function(spec: OpSpec):
    # A trailing "..." names a variable number of outputs (Split's).
    single = len(spec.outputs) == 1 and not spec.outputs[0].endswith("...")

    def op(*inputs, stream=None, device=None, **attrs):
        outputs = run_op(spec.name, inputs, attrs, stream=stream, device=device)
        return outputs[0] if single else tuple(outputs)

    op.__name__ = op.__qualname__ = spec.name
    inputs = ", ".join(i.name + ("..." if i.variadic else "=None" if i.optional else "") for i in spec.inputs)
    attrs = ", ".join(f"{a.name}={a.default!r}" for a in spec.attrs)
    op.__doc__ = f"{spec.name}({inputs}{', ' if attrs else ''}{attrs}) -> {', '.join(spec.outputs)}\n\n{spec.doc}"
    return op


for _spec in all_specs():
    globals()[_spec.name] = _op_function(_spec)

__all__ = ["OpSpec", "all_specs", "call_cache_info", "clear_call_cache", "cpu_fallback", "fallback_enabled",
           "fallback_report", "get", "infer", "run_op", "set_fallback", *(s.name for s in all_specs())]
