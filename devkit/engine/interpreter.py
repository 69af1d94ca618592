"""The interpreter: a graph of Nodes (engine.plan's) run node by node on a
device, for a graph that cannot be planned (plan.NotPlannable) or a front
end that asks for no plan (``devkit.onnx.prepare(..., plan=False)``).

Values live in two places. Device values (Arrays) are what the graph
computes: its inputs, its initializers and the outputs of device ops. Host
values (NumPy) are what only describes shapes: constants, Shape and Size of
any value (its shape is known without touching the device), and every node
whose inputs are all host values (or initializers small enough to have a
host twin) and whose outputs are small -- evaluated with the op spec's NumPy
reference. So shape subgraphs never reach the device.

Two caches make repeated runs cheap. Values that depend on no fed input
(weights made by ConstantOfShape, a transposed initializer, folded shape
arithmetic) are computed at the first run and kept; host values that depend
on input shapes are kept per set of input shapes. Other intermediate values
are dropped after their last use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from ..ops import dispatch
from ..runtime import Array, Device, asarray
from .plan import HOST_VALUE_LIMIT, SHAPE_OPS, Node, fits_host, host_eval, shape_eval


@dataclasses.dataclass
class _Liveness:
    """What the interpreter's runs with one set of fed inputs share."""

    static: list[bool]            # per node: depends on no fed input
    kept: set[str]                # static values a non-static node or a graph output reads
    release: list[list[str]]      # per node: values it is the last to read
    constants: dict | None = None  # the kept static values, once a run made them


class Interpreter:
    """Runs ``nodes`` on ``device``. ``initializers``: the graph's device
    values (a feed may override them); ``host_twins``: host copies of the
    small ones; ``output_names``: what a run returns."""

    def __init__(self, nodes: Sequence[Node], device: Device, initializers: Mapping[str, Array],
                 host_twins: Mapping[str, np.ndarray], output_names: Sequence[str]):
        self.nodes = list(nodes)
        self.device = device
        self.output_names = list(output_names)
        self._initializers = initializers
        self._host_twins = host_twins
        self._liveness: dict[frozenset, _Liveness] = {}
        self._shape_values: dict[tuple, dict[str, np.ndarray]] = {}

    def _schedule(self, fed: frozenset) -> _Liveness:
        schedule = self._liveness.get(fed)
        if schedule is not None:
            return schedule
        static_values = {name for name in self._initializers if name not in fed}
        static, last_read, kept = [], {}, set()
        for index, node in enumerate(self.nodes):
            names = [name for name in node.inputs if name]
            is_static = all(name in static_values for name in names)
            static.append(is_static)
            for name in names:
                last_read[name] = index
                if not is_static and name in static_values:
                    kept.add(name)
            for name in node.outputs:
                if name:
                    last_read.setdefault(name, index)  # an output nothing reads goes at once
                    if is_static:
                        static_values.add(name)
        kept.update(name for name in self.output_names if name in static_values)
        release = [[] for _ in self.nodes]
        for name, index in last_read.items():
            if name not in self.output_names:
                release[index].append(name)
        schedule = self._liveness[fed] = _Liveness(static, kept, release)
        return schedule

    def run(self, feed: Mapping[str, Array | np.ndarray], signature: tuple) -> list[Array | np.ndarray]:
        """The graph's outputs for ``feed`` (Arrays, or NumPy arrays for host
        values); ``signature`` names the feed's shapes (the host values kept
        per set of input shapes are found by it). Returns when they are computed."""
        schedule = self._schedule(frozenset(feed))
        shape_values = self._shape_values.get(signature)
        # Each value is an Array (on the device) or a NumPy array (a host value).
        values: dict[str, Array | np.ndarray] = {
            name: array for name, array in self._initializers.items() if name not in feed}
        values.update({name: asarray(array, self.device) for name, array in feed.items()})
        host_twins = {name: array for name, array in self._host_twins.items() if name not in feed}
        values.update(schedule.constants or {})
        values.update(shape_values or {})
        new_constants = {} if schedule.constants is None else None
        new_shape_values = {} if shape_values is None else None
        for index, node in enumerate(self.nodes):
            outputs = [name for name in node.outputs if name]
            done = schedule.constants is not None if schedule.static[index] else all(name in values for name in outputs)
            if not done:
                for name, value in zip(node.outputs, self._run_node(node, values, host_twins)):
                    if not name:
                        continue
                    values[name] = value
                    if new_constants is not None and schedule.static[index] and name in schedule.kept:
                        new_constants[name] = value
                    elif new_shape_values is not None and not schedule.static[index] and isinstance(value, np.ndarray):
                        new_shape_values[name] = value
            for name in schedule.release[index]:
                values.pop(name, None)
        if new_constants is not None:
            schedule.constants = new_constants
        if new_shape_values is not None:
            self._shape_values[signature] = new_shape_values
        # Host values, weights and the kept static values are the graph's: the caller gets copies.
        kept = schedule.constants or {}
        return [np.array(value) if isinstance(value, np.ndarray)
                else value.copy() if name in kept or name in self._initializers else value
                for name, value in ((name, values[name]) for name in self.output_names)]

    def _run_node(self, node: Node, values: dict, host_twins: dict) -> list:
        spec, attrs = node.spec, node.attrs
        if spec is None:  # a constant: a host value unless it is too big for one
            value = node.constant
            return [value if value.size <= HOST_VALUE_LIMIT else asarray(value, self.device)]
        names = list(node.inputs)
        if node.op in SHAPE_OPS:
            return shape_eval(spec, values[names[0]], attrs)
        host_inputs = [self._host_value(name, values, host_twins) if name else None for name in names]
        if all(value is not None for name, value in zip(names, host_inputs) if name):
            inferred = dispatch.infer(node.op, host_inputs, attrs)
            if fits_host(inferred):
                return host_eval(spec, host_inputs, attrs, inferred)
        return dispatch.run_op(node.op, [values[name] if name else None for name in names], attrs,
                               device=self.device, outputs=dispatch.outputs_named(node.outputs))

    @staticmethod
    def _host_value(name: str, values: dict, host_twins: dict) -> np.ndarray | None:
        """The value on the host (a host value or an initializer's twin), or None."""
        value = values[name]
        return value if isinstance(value, np.ndarray) else host_twins.get(name)
