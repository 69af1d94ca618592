"""How an op runs on a plugin: one resolution order for eager ops, ONNX models
and training (they all reach it through run_op).

For (op, key dtype, plugin): the plugin's native kernel; else the op's
decomposition (its spec's ``decompose`` rule) when every op the rule uses
resolves on the same plugin without leaving the device; else the cpu
plugin, when fallback is allowed (counted in ``fallback_report``); else
UnimplementedError. ``explain`` and ``coverage`` show the result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .. import dtypes as _dtypes
from ..abi import C
from ..engine.calls import key_dtype_of
from ..errors import UnimplementedError
from ..runtime import Array, Device, Stream, asarray
from ..runtime import device as _device
from . import dispatch
from . import spec as _spec
from .primitives import PRIMITIVES
from .spec import OpSpec, dtype_name

NATIVE, DECOMPOSED, FALLBACK, UNSUPPORTED = "native", "decomposed", "fallback", "unsupported"


@dataclasses.dataclass(frozen=True)
class Resolution:
    """How (op, dtype) runs on a plugin; ``uses``: what a decomposition calls, resolved in turn."""

    op: str
    dtype: np.dtype
    how: str
    uses: tuple[Resolution, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.op}[{dtype_name(self.dtype)}]"

    def ops(self) -> set[tuple[str, np.dtype]]:
        """Every (op, dtype) this resolution runs natively, decompositions unfolded."""
        if self.how != DECOMPOSED:
            return {(self.op, self.dtype)}
        return set().union(*(u.ops() for u in self.uses))

    def missing(self) -> set[str]:
        """The kernels an unsupported resolution lacks: its leaves that are unsupported."""
        if self.how != UNSUPPORTED:
            return set()
        if not self.uses:
            return {self.label}
        return set().union(*(u.missing() for u in self.uses))

    def lines(self, depth: int = 0) -> list[str]:
        lines = ["  " * depth + f"{self.label}: {self.how}"]
        for use in self.uses:
            lines += use.lines(depth + 1)
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())


# -- static resolution per plugin --------------------------------------------------------

def _plans_of(plugin) -> dict:
    """The plans cached on a plugin: its kernel table is fixed once it loads."""
    plans = getattr(plugin, "_resolution_plans", None)
    if plans is None:
        plans = plugin._resolution_plans = {}
    return plans


def _plan(plugin, op: str, dtype: np.dtype, visiting: frozenset = frozenset()) -> Resolution:
    """Native or decomposed (recursively, on this plugin alone), else unsupported."""
    plans = _plans_of(plugin)
    key = (op, dtype_name(dtype))
    if key in plans:
        return plans[key]
    spec = _spec.get(op)
    if plugin.kernel_entry(op, dtype) is not None:
        plan = Resolution(op, dtype, NATIVE)
    elif spec.decompose is None or key in visiting:
        plan = Resolution(op, dtype, UNSUPPORTED)
    else:
        uses = tuple(_plan(plugin, name, d, visiting | {key}) for name, d in spec.decompose.uses_for(op, dtype))
        ok = all(u.how != UNSUPPORTED for u in uses)
        plan = Resolution(op, dtype, DECOMPOSED if ok else UNSUPPORTED, uses)
    plans[key] = plan  # (the uses graph is acyclic: tests/test_op_specs.py)
    return plan


def explain(op: str, dtype, device: str | Device | None = None) -> Resolution:
    """How ``op`` at key dtype ``dtype`` runs on ``device`` (default cpu:0):
    native, decomposed into which ops (recursively), fallback or unsupported.
    ``print(explain(...))`` shows the tree."""
    spec = _spec.get(op)
    dtype = _dtypes.normalize(dtype)
    if dtype not in spec.dtypes:
        raise TypeError(f"{op}: dtype {dtype_name(dtype)} is not supported "
                        f"(the op takes {', '.join(dtype_name(d) for d in spec.dtypes)})")
    target = device if isinstance(device, Device) else _device(device or "cpu:0")
    plan = _plan(target.plugin, op, dtype)
    if plan.how == UNSUPPORTED and _may_fall_back(target):
        if _plan(_device("cpu:0").plugin, op, dtype).how != UNSUPPORTED:
            return Resolution(op, dtype, FALLBACK)
    return plan


def coverage(device: str | Device | None = None) -> list[Resolution]:
    """``explain`` for every (op, dtype) of the op set on ``device``."""
    return [explain(s.name, d, device) for s in _spec.all_specs() for d in s.dtypes]


def coverage_counts(device: str | Device | None = None) -> dict[str, int]:
    """How many (op, dtype) pairs run each way on ``device``."""
    counts = dict.fromkeys((NATIVE, DECOMPOSED, FALLBACK, UNSUPPORTED), 0)
    for r in coverage(device):
        counts[r.how] += 1
    return counts


def primitive_summary(plugin) -> dict:
    """What a plugin's kernels of the primitive set give it: how many
    primitives it has at every dtype, which it lacks, and how many (op,
    dtype) pairs it runs (natively or decomposed) on its own."""
    complete = sorted(p for p in PRIMITIVES
                      if all(plugin.kernel_entry(p, d) is not None for d in _spec.get(p).dtypes))
    plans = [_plan(plugin, s.name, d) for s in _spec.all_specs() for d in s.dtypes]
    return {"primitives": complete, "missing": sorted(PRIMITIVES - set(complete)),
            "native": sum(p.how == NATIVE for p in plans),
            "decomposed": sum(p.how == DECOMPOSED for p in plans), "pairs": len(plans)}


def _may_fall_back(dev: Device) -> bool:
    return dispatch.fallback_enabled() and dev.plugin is not _device("cpu:0").plugin


# -- running a decomposition ---------------------------------------------------------------

class Builder:
    """What a decomposition rule calls ops through: on the op's device and stream."""

    def __init__(self, dev: Device, stream: Stream | None, dtype: np.dtype, record: list | None = None):
        self.device, self.stream, self.dtype = dev, stream, dtype
        self._record = record

    def __call__(self, op: str, *inputs, **attrs):
        spec = _spec.get(op)
        if self._record is not None:
            self._record.append((op, _key_dtype(spec, inputs, attrs)))
        outputs = dispatch.run_op(op, inputs, attrs, stream=self.stream, device=self.device)
        single = len(spec.outputs) == 1 and not spec.outputs[0].endswith("...")
        return outputs[0] if single else tuple(outputs)

    def infer(self, op: str, *inputs, **attrs) -> list[tuple[tuple[int, ...], np.dtype]]:
        """The output shapes and dtypes of a call, without running it."""
        return dispatch.infer(op, inputs, attrs)

    @staticmethod
    def spec_attr(op: str, name: str) -> bool:
        """Whether ``name`` is an attribute of ``op`` (not a host input's value)."""
        return _spec.get(op).attr(name) is not None

    def const(self, value, dtype=None) -> Array:
        """A constant (a scalar or a small table computed from shapes) on the
        device; integers wrap into ``dtype`` (-1 is 255 in uint8)."""
        value = np.asarray(value)
        dtype = _dtypes.normalize(dtype) if dtype is not None else (
            np.dtype(bool) if value.dtype == bool else self.dtype)
        return asarray(value.astype(dtype), self.device, stream=self.stream)


def _key_dtype(spec: OpSpec, inputs: Sequence, attrs: dict) -> np.dtype:
    if isinstance(spec.key, str):
        return _dtypes.normalize(attrs[spec.key])
    value = inputs[spec.key]
    return value.dtype if isinstance(value, Array) else _dtypes.normalize(np.asarray(value).dtype)


def rule_inputs(spec: OpSpec, dev: Device, inputs: Sequence, host_values: dict,
                stream: Stream | None) -> list:
    """The positional inputs a rule gets: device Arrays (NumPy inputs copied
    there), None where omitted, host inputs as their NumPy values."""
    host_positions = [i for i, d in enumerate(spec.inputs) if d.host and d.name in host_values]
    result = []
    for position in range(max([len(inputs)] + [i + 1 for i in host_positions])):
        decl = spec.inputs[min(position, len(spec.inputs) - 1)]
        if decl.host:
            result.append(host_values.get(decl.name))
            continue
        value = inputs[position] if position < len(inputs) else None
        if value is not None and not isinstance(value, Array):
            value = asarray(np.asarray(value), dev, stream=stream)
        result.append(value)
    return result


def decompose(spec: OpSpec, dev: Device, xs: list, attrs: dict, host_values: dict, dtype: np.dtype,
              stream: Stream | None, record: list | None = None) -> list[Array]:
    """Runs ``spec``'s rule on rule inputs ``xs`` (see rule_inputs) and the
    resolved attributes; the rule sees the host values among the attributes.
    ``record`` collects the calls."""
    b = Builder(dev, stream, dtype, record)
    rule = spec.decompose
    if (wide := rule.wider(dtype)) is not None:
        return _widened(spec, b, xs, attrs, dtype, wide)
    outputs = rule.rule(b, xs, {**attrs, **host_values})
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _widened(spec: OpSpec, b: Builder, xs: list, attrs: dict, dtype: np.dtype, wide: np.dtype) -> list[Array]:
    """The op at a wider float dtype between Casts: what a float16/bfloat16
    kernel computes (float32), or a float32 one that accumulates in double."""
    widened = [b("Cast", x, to=wide) if isinstance(x, Array) and x.dtype == dtype else x for x in xs]
    own = dict(attrs)
    if isinstance(spec.key, str):
        own[spec.key] = wide
    wanted = [d for _, d in b.infer(spec.name, *xs, **attrs)]
    outputs = b(spec.name, *widened, **own)
    outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
    return [b("Cast", y, to=d) if y.dtype != d else y for y, d in zip(outputs, wanted)]


def run_without_kernel(spec: OpSpec, dev: Device, inputs: Sequence, attrs: dict, host_values: dict,
                       key_dtype: np.dtype, stream: Stream | None) -> list[Array]:
    """After the native kernel: the decomposition, then fallback, then UnimplementedError."""
    plugin = dev.plugin
    plan = _plan(plugin, spec.name, key_dtype)
    if plan.how == DECOMPOSED:
        xs = rule_inputs(spec, dev, inputs, host_values, stream)
        return decompose(spec, dev, xs, attrs, host_values, key_dtype, stream)
    if not _may_fall_back(dev):
        have = sorted({dtype_name(key_dtype_of(e)) for e in plugin.kernel_entries(spec.name)})
        detail = f"it has {', '.join(have)}" if have else "it has no kernel for the op"
        if spec.decompose is not None:
            lacking = sorted(plan.missing())
            shown = ", ".join(lacking[:8]) + (f" and {len(lacking) - 8} more" if len(lacking) > 8 else "")
            detail += f", and its decomposition needs kernels for {shown}"
        raise UnimplementedError(
            f"{spec.name}: plugin '{plugin.name}' has no kernel for dtype {dtype_name(key_dtype)} "
            f"({detail}); devkit.ops.set_fallback(True) allows running it on the cpu plugin",
            C.DK_UNIMPLEMENTED)
    dispatch.count_fallback(plugin.name, spec.name, key_dtype)
    moved = [value.numpy(stream) if isinstance(value, Array) else value for value in inputs]
    results = dispatch.run_op(spec.name, moved, attrs, device=_device("cpu:0"))
    return [result.to(dev, stream) for result in results]


def run_decomposed(op: str, inputs: Sequence, attrs=None, *, device=None, stream: Stream | None = None,
                   record: list | None = None) -> list[Array]:
    """Runs ``op`` through its decomposition even where a native kernel exists
    (the ops it uses resolve as usual): for checking a rule against the op's
    reference, and for timing it against the kernel. ``record`` collects the
    (op, key dtype) calls the rule makes."""
    spec = _spec.get(op)
    if spec.decompose is None:
        raise ValueError(f"{op} has no decomposition (it is {'a primitive' if op in PRIMITIVES else 'undecomposed'})")
    dev, _, host_values, _, resolved, key_dtype = dispatch._prepare(spec, inputs, attrs, device, stream)
    xs = rule_inputs(spec, dev, inputs, host_values, stream)
    return decompose(spec, dev, xs, resolved, host_values, key_dtype, stream, record)


def find_cycle(uses) -> list | None:
    """A cycle in the graph ``uses(node) -> [node, ...]`` over every (op, dtype)
    of the op set, as the list of nodes on it, or None."""
    state: dict = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in uses(node):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = "done"
        return None

    for spec in _spec.all_specs():
        for dtype in spec.dtypes:
            node = (spec.name, dtype_name(dtype))
            if node not in state and (cycle := visit(node, [node])):
                return cycle
    return None


def decomposition_uses(node: tuple[str, str]) -> list[tuple[str, str]]:
    """The (op, dtype name) pairs an (op, dtype name) pair's decomposition calls."""
    spec = _spec.get(node[0])
    if spec.decompose is None:
        return []
    dtype = next(d for d in spec.dtypes if dtype_name(d) == node[1])
    return [(op, dtype_name(d)) for op, d in spec.decompose.uses_for(spec.name, dtype)]
