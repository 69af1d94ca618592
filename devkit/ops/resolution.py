"""How an op runs on a plugin: one resolution order for eager ops, ONNX models
and training (they all reach it through run_op).

For (op, key dtype, plugin): the plugin's native kernel; else the op's
decomposition (its spec's ``decompose`` rule) when every op the rule uses
resolves on the same plugin without leaving the device; else the cpu
plugin, when fallback is allowed (counted in ``fallback_report``); else
UnimplementedError. ``explain`` and ``coverage`` show the result; run_op
(devkit.ops.dispatch, above this module) follows it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import threading

import numpy as np

from .. import dtypes as _dtypes
from ..runtime import Device
from ..runtime import device as _device
from . import spec as _spec
from .primitives import PRIMITIVES
from .spec import dtype_name

NATIVE, DECOMPOSED, FALLBACK, UNSUPPORTED = "native", "decomposed", "fallback", "unsupported"

# -- CPU fallback -------------------------------------------------------------------

_fallback = threading.local()
_fallback_default = os.environ.get("DEVKIT_CPU_FALLBACK", "") not in ("", "0")
_fallback_counts: collections.Counter = collections.Counter()
_fallback_lock = threading.Lock()


def fallback_enabled() -> bool:
    return getattr(_fallback, "enabled", _fallback_default)


def set_fallback(enabled: bool) -> None:
    """Allow (or forbid) running ops that a plugin lacks on the cpu plugin, in
    this thread. Off unless DEVKIT_CPU_FALLBACK=1; every fallback is counted."""
    _fallback.enabled = bool(enabled)


@contextlib.contextmanager
def cpu_fallback(enabled: bool = True):
    """``with devkit.ops.cpu_fallback(): ...`` allows fallback inside the block."""
    previous = fallback_enabled()
    set_fallback(enabled)
    try:
        yield
    finally:
        set_fallback(previous)


def count_fallback(plugin: str, op: str, dtype) -> None:
    """Count one fallback of ``op`` (an op of devkit's or another layer's, such as
    an aten op the torch bridge ran on torch's CPU) in ``fallback_report``."""
    with _fallback_lock:
        _fallback_counts[(plugin, op, "-" if dtype is None else dtype_name(dtype))] += 1


def fallback_report(reset: bool = False) -> list[dict]:
    """Every fallback so far: plugin, op, dtype and count, most frequent first."""
    with _fallback_lock:
        rows = [{"plugin": p, "op": op, "dtype": d, "count": n}
                for (p, op, d), n in _fallback_counts.most_common()]
        if reset:
            _fallback_counts.clear()
    return rows


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


def resolve(plugin, op: str, dtype: np.dtype, visiting: frozenset = frozenset()) -> Resolution:
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
        uses = tuple(resolve(plugin, name, d, visiting | {key}) for name, d in spec.decompose.uses_for(op, dtype))
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
    plan = resolve(target.plugin, op, dtype)
    if plan.how == UNSUPPORTED and may_fall_back(target):
        if resolve(_device("cpu:0").plugin, op, dtype).how != UNSUPPORTED:
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
    plans = [resolve(plugin, s.name, d) for s in _spec.all_specs() for d in s.dtypes]
    return {"primitives": complete, "missing": sorted(PRIMITIVES - set(complete)),
            "native": sum(p.how == NATIVE for p in plans),
            "decomposed": sum(p.how == DECOMPOSED for p in plans), "pairs": len(plans)}


def may_fall_back(dev: Device) -> bool:
    return fallback_enabled() and dev.plugin is not _device("cpu:0").plugin


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
