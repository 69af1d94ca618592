"""devkit's operator set: the spec of every op, and every op as a function.

``devkit.ops.Conv(x, w, b, strides=[2, 2])`` runs ONNX's Conv on the device
of ``x``. An op function returns the outputs ONNX requires -- one Array, or a
tuple for several (TopK, Split) -- and an optional output only when asked:
``ops.MaxPool(x, kernel_shape=[2, 2], return_indices=True)`` (or
``outputs=2``, the first two) returns ``(Y, Indices)``; the op's docstring
and docs/operators.md name each op's ``return_<output>`` keywords.
``devkit.run_op(name, inputs, attrs)`` is the generic form. See
docs/operators.md.
"""

from __future__ import annotations

import importlib
import re

from .dispatch import call_cache_info, clear_call_cache, infer, run_op
from .dispatch import run_plain as _run_plain
from .primitives import PRIMITIVES, PRIMITIVES_VERSION
from .spec import OpSpec, all_specs, get

# One module per op family; importing one registers its specs.
FAMILIES = ("unary", "binary", "reduce", "linalg", "nn", "movement", "shape", "training")
for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")
# The decomposition rules of the non-primitive ops (attached to their specs).
RULES = ("rules_elementwise", "rules_movement", "rules_reduce", "rules_nn", "rules_linalg", "rules_training")
for _rules in RULES:
    importlib.import_module(f"{__name__}.{_rules}")
from . import resolution  # noqa: E402
from .resolution import coverage, cpu_fallback, explain, fallback_enabled, fallback_report, set_fallback  # noqa: E402


def output_keyword(output: str) -> str:
    """The ``return_<name>`` keyword that asks ``devkit.ops.X`` for an output:
    the ONNX output name in snake_case (Indices: return_indices, InvStdDev:
    return_inv_std_dev, qk_matmul_output: return_qk_matmul_output)."""
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", output.rstrip(".")).lower()
    return f"return_{name}"


def _outputs_doc(spec: OpSpec) -> str:
    """What the op function returns, for its docstring."""
    if any(o.endswith("...") for o in spec.outputs):
        return "Returns a tuple: one Array per output (as many as the call makes)."
    required = spec.outputs[:spec.required_outputs]
    lines = [f"Returns {', '.join(required)}" + (" (an Array)." if len(required) == 1 else ", a tuple.")]
    if spec.optional_outputs:
        optional = spec.outputs[spec.required_outputs:]
        asks = ", ".join(f"{o} ({output_keyword(o)}=True)" for o in optional)
        lines.append(f"Optional outputs, returned only when asked for: {asks}; or outputs=n, the first n "
                     f"outputs ({spec.required_outputs} to {len(spec.outputs)}). Asking for more than one "
                     "output returns a tuple, in the op's output order.")
        if spec.skippable_outputs:
            skipped = spec.outputs[len(spec.outputs) - spec.skippable_outputs:]
            lines.append(f"{' and '.join(skipped)} {'is' if len(skipped) == 1 else 'are'} not even computed "
                         "unless asked for.")
    return "\n".join(lines)


def _requested(spec: OpSpec, outputs, flags: dict) -> list[int]:
    """The positions of the outputs a call asks for: the required ones, the
    first ``outputs``, and those whose return_<name> flag is true."""
    name, count, required = spec.name, len(spec.outputs), spec.required_outputs
    keywords = {output_keyword(o): position for position, o in enumerate(spec.outputs)}
    optional_keywords = ", ".join(output_keyword(o) for o in spec.outputs[required:])
    choices = f"its optional outputs are asked for with {optional_keywords}" if optional_keywords \
        else "it has no optional outputs"
    if any(o.endswith("...") for o in spec.outputs):
        if outputs is not None:
            raise TypeError(f"{name}: outputs={outputs!r}: its outputs are variadic (as many as the call makes), "
                            "so there is nothing to ask for")
        if flags:
            raise TypeError(f"{name}() got an unexpected keyword argument '{next(iter(flags))}' ({choices})")
        return []
    wanted = set(range(required))
    if outputs is not None:
        if isinstance(outputs, bool) or not isinstance(outputs, int):
            raise TypeError(f"{name}: outputs must be an int (how many leading outputs), not {outputs!r}")
        if not required <= outputs <= count:
            plural = required > 1
            what = (f"its output{'s' if plural else ''} {', '.join(spec.outputs[:required])} "
                    f"{'are' if plural else 'is'} required" if outputs < required
                    else f"it has {count} output{'s' if count > 1 else ''}")
            raise ValueError(f"{name}: outputs={outputs} is out of range: {what} "
                             f"(outputs= takes {required} to {count})")
        wanted.update(range(outputs))
    for keyword, value in flags.items():
        position = keywords.get(keyword)
        if position is None:
            raise TypeError(f"{name}() got an unexpected keyword argument '{keyword}' ({choices})")
        if position < required:
            raise TypeError(f"{name}: {keyword}: output '{spec.outputs[position]}' is required and always "
                            f"returned ({choices})")
        if value:
            wanted.add(position)
        elif position in wanted:
            raise ValueError(f"{name}: outputs={outputs} includes '{spec.outputs[position]}', "
                             f"but {keyword} is false")
    return sorted(wanted)


def _op_function(spec: OpSpec):
    name = spec.name
    # A trailing "..." names a variable number of outputs (Split's): always a tuple.
    variadic = any(o.endswith("...") for o in spec.outputs)
    single = not variadic and spec.required_outputs == 1
    # What a call that asks for nothing wants: the required outputs only (None: all, there are no others).
    default = spec.required_outputs if spec.optional_outputs else None
    placement = (None, default)  # run_op's cache key part for a call without device or outputs

    def op(*inputs, stream=None, device=None, outputs=None, **attrs):
        if outputs is None:
            if not attrs and stream is None and device is None:
                results = _run_plain(name, inputs, placement)
                return results[0] if single else tuple(results)
            for keyword in attrs:
                if keyword.startswith("return_"):
                    break
            else:  # the common call: the required outputs
                results = run_op(name, inputs, attrs, stream=stream, device=device, outputs=default)
                return results[0] if single else tuple(results)
        flags = {k: v for k, v in attrs.items() if k.startswith("return_")}
        attrs = {k: v for k, v in attrs.items() if not k.startswith("return_")}
        wanted = _requested(spec, outputs, flags)
        if not wanted:  # variadic
            return tuple(run_op(name, inputs, attrs, stream=stream, device=device))
        results = run_op(name, inputs, attrs, stream=stream, device=device, outputs=wanted[-1] + 1)
        return results[wanted[0]] if len(wanted) == 1 else tuple(results[k] for k in wanted)

    op.__name__ = op.__qualname__ = name
    inputs = ", ".join(i.name + ("..." if i.variadic else "=None" if i.optional else "") for i in spec.inputs)
    attrs = ", ".join(f"{a.name}={a.default!r}" for a in spec.attrs)
    required = ", ".join(spec.outputs[:spec.required_outputs])
    optional = "".join(f"[, {o}]" for o in spec.outputs[spec.required_outputs:])
    keywords = ", ".join(f"{output_keyword(o)}=False" for o in spec.outputs[spec.required_outputs:])
    extra = ", ".join(part for part in (attrs, "outputs=None" if spec.optional_outputs else "", keywords) if part)
    op.__doc__ = (f"{name}({inputs}{', ' if extra else ''}{extra}) -> {required}{optional}\n\n"
                  f"{_outputs_doc(spec)}\n\n{spec.doc}")
    return op


for _spec in all_specs():
    globals()[_spec.name] = _op_function(_spec)

__all__ = ["PRIMITIVES", "PRIMITIVES_VERSION", "OpSpec", "all_specs", "call_cache_info", "clear_call_cache",
           "coverage", "cpu_fallback", "explain", "fallback_enabled", "fallback_report", "get", "infer", "run_op",
           "set_fallback", *(s.name for s in all_specs())]
