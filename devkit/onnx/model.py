"""devkit.onnx.prepare: an ONNX model run op by op on any devkit plugin.

A model is checked whole at prepare: its opset, every node's op, domain and
attributes, the dtypes of graph inputs and initializers, and (where ONNX's
type inference knows them) the dtype of every node's key input. Anything outside the
op set raises UnsupportedNodeError naming the node, before anything runs.

Each set of input shapes runs as a devkit.engine plan, or, where it
cannot be planned (or ``plan=False``), in devkit.engine's interpreter, node
by node. Either way shape subgraphs (Shape -> Gather -> Concat -> Reshape's
target) are evaluated on the host and never reach the device, and values
that depend on no graph input are computed once and kept.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Mapping

import numpy as np

from .. import dtypes as _dtypes
from ..engine.interpreter import Interpreter
from ..engine.plan import HOST_VALUE_LIMIT, Node, NotPlannable, Plan, build_plan
from ..ops import dispatch, resolution
from ..ops import spec as _spec
from ..runtime import Array, Device, Stream, asarray
from ..runtime import device as _device
from . import rewrite as _rewrite
from .nodes import (InvalidModelError, Step, UnsupportedNodeError, _constant, _describe, check_node,
                    node_attributes, onnx_dtype, to_numpy)

MIN_OPSET, MAX_OPSET = 13, 23


def load(model):
    """``model`` (a ModelProto, its serialized bytes or a path) as a ModelProto
    of ONNX opset 13 or later: older models go through onnx's version converter."""
    import onnx
    from onnx import version_converter

    if isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    elif isinstance(model, (str, os.PathLike)):
        model = onnx.load(os.fspath(model))
    elif not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto, bytes or a path, got {type(model).__name__}")
    version = _onnx_opset(model)
    if version > MAX_OPSET:
        raise UnsupportedNodeError(
            f"the model imports ONNX opset {version}; devkit runs opsets {MIN_OPSET} to {MAX_OPSET}")
    if version >= MIN_OPSET:
        return model
    try:
        return version_converter.convert_version(model, MIN_OPSET)
    except (version_converter.ConvertError, RuntimeError, ValueError) as exc:  # a failing adapter raises RuntimeError
        raise UnsupportedNodeError(f"the model imports ONNX opset {version}, and onnx's version converter "
                                   f"could not bring it to {MIN_OPSET}: {exc}") from None


def _onnx_opset(model) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    raise UnsupportedNodeError("the model imports no ONNX opset")


def _check_step(node) -> Step:
    spec = check_node(node)
    if spec is None:
        value = _constant(node)
        try:
            _dtypes.normalize(value.dtype)
        except TypeError as exc:
            raise UnsupportedNodeError(f"{_describe(node)}: {exc}") from None
        return Step(node, None, {}, value)
    attrs = node_attributes(node, spec)
    try:
        dispatch.resolve_attrs(spec, attrs)  # attribute values outside the spec's choices or checks
    except (TypeError, ValueError) as exc:
        raise UnsupportedNodeError(f"{_describe(node)}: {exc}") from None
    return Step(node, spec, attrs)


def _inferred_values(model) -> tuple[dict[str, int], dict[str, _rewrite.ValueInfo]]:
    """What ONNX's type and shape inference knows of each value: its element
    type code (0: not inferred; initializers' own), and its dtype and shape
    (symbolic dims by name) for the rewrites."""
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(model).graph
    types, infos = {}, {}
    for value in [*inferred.value_info, *inferred.input, *inferred.output]:
        if not value.type.HasField("tensor_type"):
            continue
        tensor = value.type.tensor_type
        types[value.name] = tensor.elem_type
        try:
            dtype = onnx_dtype(tensor.elem_type) if tensor.elem_type else None
        except UnsupportedNodeError:
            dtype = None
        shape = (tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in tensor.shape.dim)
                 if tensor.HasField("shape") else None)
        infos[value.name] = _rewrite.ValueInfo(dtype, shape)
    types.update({init.name: init.data_type for init in model.graph.initializer})
    return types, infos


def _check_key_dtypes(types: dict[str, int], steps: list[Step]) -> None:
    """ONNX's type inference gives the dtype of most values (``types``): a
    node whose key input has a dtype the op does not take fails here, not in
    the middle of a run."""
    for step in steps:
        spec, node = step.spec, step.node
        if spec is None:
            continue
        if isinstance(spec.key, str):  # a dtype attribute, e.g. EyeLike's
            dtype = dispatch.resolve_attrs(spec, step.attrs).get(spec.key)
        elif spec.key < len(node.input) and types.get(node.input[spec.key]):  # 0: not inferred
            try:
                dtype = onnx_dtype(types[node.input[spec.key]])
            except UnsupportedNodeError as exc:
                raise UnsupportedNodeError(f"{_describe(node)}: input '{node.input[spec.key]}': {exc}") from None
        else:
            continue
        if dtype is not None and dtype not in spec.dtypes:
            allowed = ", ".join(_spec.dtype_name(d) for d in spec.dtypes)
            raise UnsupportedNodeError(f"{_describe(node)}: {node.op_type} on {_spec.dtype_name(dtype)} is "
                                       f"outside the op set (it takes {allowed})")


def _graph_order(graph) -> list:
    """The graph's nodes in an order that runs: topological, ties kept in the
    model's order (so a sorted graph keeps its own), as onnxruntime sorts.
    InvalidModelError names what makes a graph unrunnable: a node without
    outputs, a value produced twice, an input or graph output nothing
    produces, a cycle."""
    available = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        outputs = [name for name in node.output if name]
        if not outputs:
            raise InvalidModelError(f"{_describe(node, index)} has no outputs")
        for name in outputs:
            if name in available or name in producer:
                first = ("a graph input or initializer" if name in available
                         else _describe(graph.node[producer[name]], producer[name]))
                raise InvalidModelError(f"value '{name}' is produced twice: by {first} and by "
                                        f"{_describe(node, index)}")
            producer[name] = index
    producers = []                                  # per node: the nodes whose outputs it reads
    for index, node in enumerate(graph.node):
        needed = set()
        for name in node.input:
            if name and name not in available:
                if name not in producer:
                    raise InvalidModelError(f"{_describe(node, index)}: input '{name}' is not a graph input, "
                                            f"an initializer or any node's output")
                needed.add(producer[name])
        producers.append(sorted(needed))
    readers: list[list[int]] = [[] for _ in graph.node]
    for index, needed in enumerate(producers):
        for first in needed:
            readers[first].append(index)
    waiting = [len(needed) for needed in producers]  # per node: producers not yet placed
    ready = [index for index, count in enumerate(waiting) if count == 0]
    order = []
    while ready:
        index = heapq.heappop(ready)
        order.append(graph.node[index])
        for reader in readers[index]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, reader)
    if len(order) < len(graph.node):
        raise InvalidModelError(f"the graph has a cycle: {_cycle(graph, producers, waiting)}")
    for value in graph.output:
        if value.name not in available and value.name not in producer:
            raise InvalidModelError(f"graph output '{value.name}' is not a graph input, an initializer or "
                                    f"any node's output")
    return order


def _cycle(graph, producers: list[list[int]], waiting: list[int]) -> str:
    """A cycle among the nodes a topological sort could not place: each waits
    on an unplaced producer, so walking back from one must come round."""
    path, seen = [], {}
    index = next(index for index, count in enumerate(waiting) if count)
    while index not in seen:
        seen[index] = len(path)
        path.append(index)
        index = next(first for first in producers[index] if waiting[first])
    loop = path[seen[index]:] + [index]
    return " <- ".join(_describe(graph.node[i], i) for i in loop) + " (each reads an output of the next)"


def check_model(model) -> None:
    """Raise UnsupportedNodeError naming what in ``model`` devkit cannot run,
    or InvalidModelError naming what makes it invalid ONNX; uploads nothing."""
    _Checked(load(model))


class _Checked:
    """A model loaded, upgraded and checked: what prepare knows before uploading."""

    def __init__(self, model):
        from onnx import numpy_helper

        self.model = model
        graph = model.graph
        self.steps = [_check_step(node) for node in _graph_order(graph)]
        types, self.value_infos = _inferred_values(model)
        _check_key_dtypes(types, self.steps)
        for init in graph.initializer:
            try:
                onnx_dtype(init.data_type)
            except UnsupportedNodeError as exc:
                raise UnsupportedNodeError(f"initializer '{init.name}': {exc}") from None
        self.initializers = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        self.input_names = [value.name for value in graph.input]
        # Inputs that are also initializers carry defaults a feed may override (ONNX IR >= 4).
        self.feed_names = [name for name in self.input_names if name not in self.initializers]
        self.output_names = [value.name for value in graph.output]
        self.input_types: dict[str, tuple[np.dtype, tuple | None]] = {}
        for value in graph.input:
            if not value.type.HasField("tensor_type"):
                raise UnsupportedNodeError(f"graph input '{value.name}' is not a tensor")
            tensor = value.type.tensor_type
            try:
                dtype = onnx_dtype(tensor.elem_type)
            except UnsupportedNodeError as exc:
                raise UnsupportedNodeError(f"graph input '{value.name}': {exc}") from None
            # Fixed dims as ints, symbolic or unknown ones as None; no shape at all: None.
            shape = (tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
                     if tensor.HasField("shape") else None)
            self.input_types[value.name] = (dtype, shape)


class PreparedModel:
    """A model checked against the op set, its initializers on the device.

    With ``plan`` (the default) each set of input shapes is compiled into a
    devkit.engine Plan at its first run and replayed after; ``plans`` maps
    each signature (fed names and shapes) to its Plan, or to why the
    interpreter runs it instead. ``plan=False`` runs node by node.

    ``rewrites`` (a devkit.onnx.rewrite.RewriteReport; ``as_dict()``) says
    which graph rewrites prepare made and which candidates it left, and why;
    ``optimize=False`` makes none."""

    def __init__(self, model, device: str | Device | None = None, plan: bool = True, fuse: bool | None = None,
                 optimize: bool = True, prepare_weights: bool = True):
        checked = _Checked(load(model))
        self.model = checked.model
        self.device = _device(device)
        # Fusion (engine.fusion) is on by default where the plugin has the codegen section.
        self.fuse = self.device.plugin.has_codegen if fuse is None else bool(fuse)
        self.prepare_weights = prepare_weights
        self.input_names = checked.input_names
        self.feed_names = checked.feed_names
        self.output_names = checked.output_names
        steps, initializers = checked.steps, checked.initializers
        self.rewrites = _rewrite.RewriteReport(enabled=False)
        if optimize:  # the same rewritten steps for plans and the interpreter
            steps, initializers, self.rewrites = _rewrite.optimize(
                steps, initializers, checked.input_names, checked.output_names, checked.value_infos,
                self._has_fused_conv)
        self._input_types = checked.input_types
        self._initializers = {name: asarray(array, self.device) for name, array in initializers.items()}
        self._host_twins = {name: array for name, array in initializers.items()
                            if array.size <= HOST_VALUE_LIMIT}
        self.planned = plan
        self.plans: dict[tuple, Plan | str] = {}
        self._static_values: dict[frozenset, dict] = {}
        self._nodes = [Node(step.node.op_type, step.spec, tuple(step.node.input), tuple(step.node.output),
                            step.attrs, step.constant) for step in steps]
        self._interpreter = Interpreter(self._nodes, self.device, self._initializers, self._host_twins,
                                        self.output_names)
        # The fast path of a run: a dict of exactly the fed names, each an
        # ndarray of its declared dtype and of a shape already accepted.
        self._feed_set = frozenset(self.feed_names)
        self._sorted_feed_names = sorted(self.feed_names)
        self._accepted_shapes: dict[str, set] = {name: set() for name in self.feed_names}

    def _has_fused_conv(self, dtype: np.dtype) -> bool:
        """Whether the device's plugin has a native FusedConv kernel at ``dtype``."""
        return (dtype in _spec.get("FusedConv").dtypes
                and resolution.explain("FusedConv", dtype, self.device).how == resolution.NATIVE)

    # -- inputs ------------------------------------------------------------------------

    def _bind(self, inputs) -> dict[str, np.ndarray]:
        if type(inputs) is dict and inputs.keys() == self._feed_set:
            types, accepted = self._input_types, self._accepted_shapes
            for name, value in inputs.items():
                if not (type(value) is np.ndarray and (value.dtype is types[name][0] or value.dtype == types[name][0])
                        and value.shape in accepted[name]):
                    break
            else:
                return inputs
        if isinstance(inputs, Mapping):
            unknown = [name for name in inputs if name not in self.input_names]
            if unknown:
                raise ValueError(f"unknown input '{unknown[0]}' (the model takes {', '.join(self.feed_names)})")
            feed = dict(inputs)
        else:
            inputs = list(inputs)
            # A list longer than the inputs without initializers lists every graph input.
            names = self.feed_names if len(inputs) <= len(self.feed_names) else self.input_names
            if len(inputs) > len(names):
                raise ValueError(f"{len(inputs)} inputs given; the model takes {len(self.feed_names)}")
            feed = dict(zip(names, inputs))
        missing = [name for name in self.feed_names if name not in feed]
        if missing:
            raise ValueError(f"input '{missing[0]}' is missing")
        bound = {}
        for name, value in feed.items():
            if isinstance(value, Array):
                if value.device is not self.device:
                    raise ValueError(f"input '{name}' is on {value.device}; the model runs on {self.device}")
                array = value
            else:
                array = np.asarray(value)
            dtype, shape = self._input_types[name]
            if array.dtype != dtype:
                raise TypeError(f"input '{name}' has dtype {array.dtype}, the model declares "
                                f"{_spec.dtype_name(dtype)}")
            if shape is not None and (array.ndim != len(shape) or any(
                    want is not None and want != got for want, got in zip(shape, array.shape))):
                declared = "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"
                raise ValueError(f"input '{name}' has shape {array.shape}, the model declares {declared}")
            if name in self._accepted_shapes:
                self._accepted_shapes[name].add(array.shape)
            bound[name] = array
        return bound

    # -- running -------------------------------------------------------------------------

    def run(self, inputs, stream: Stream | None = None, *, outputs=None) -> list:
        """Run the model: ``inputs`` is a list (graph-input order) or a dict by
        name of NumPy arrays or devkit Arrays on the model's device. A dict
        may also override initializers that are graph inputs; so may a list
        that gives every graph input.

        Returns the outputs: devkit Arrays on the device where every input
        is one (the data stays on the device, as with onnxruntime's
        IOBinding), else NumPy arrays. ``outputs``: a list with, per graph
        output, an array to write it into (a NumPy array or a devkit Array
        of its shape and dtype; None: a new one); those arrays are returned.
        A planned run uses Arrays, and on a plugin that registers host memory
        large NumPy arrays, in place rather than copying them (docs/engine.md,
        "I/O binding").

        A planned run on ``stream`` waits for nothing: its outputs are
        defined once the stream has been synchronized. Without one (and
        always for the interpreter) it returns when they are."""
        feed = self._bind(inputs)
        if feed is inputs:  # _bind's fast path: NumPy arrays of exactly the fed names
            device_outputs = False
            signature = tuple([(name, feed[name].shape) for name in self._sorted_feed_names])
        else:
            # Arrays out where every input is an Array.
            device_outputs = bool(feed) and all(isinstance(value, Array) for value in feed.values())
            if feed.keys() == self._feed_set:
                signature = tuple([(name, feed[name].shape) for name in self._sorted_feed_names])
            else:
                signature = tuple(sorted((name, array.shape) for name, array in feed.items()))
        if self.planned:
            plan = self.plans.get(signature)
            if plan is None:
                plan = self.plans[signature] = self._build_plan(feed)
            if isinstance(plan, Plan):
                return plan.run(feed, stream, outputs=outputs, device_outputs=device_outputs)
        results = self._interpreter.run(feed, signature)
        if outputs is None:
            return [asarray(value, self.device) for value in results] if device_outputs else \
                [to_numpy(value) for value in results]
        if len(outputs) != len(results):
            raise ValueError(f"outputs: {len(outputs)} given; the graph has {len(results)}")
        return [_deliver(value, given, self.device, device_outputs) for value, given in zip(results, outputs)]

    def _build_plan(self, feed: dict) -> Plan | str:
        """The plan for these inputs' shapes, or why there cannot be one."""
        values = {name: array for name, array in self._initializers.items() if name not in feed}
        try:
            return build_plan(self._nodes, self.device, values,
                              {name: array for name, array in self._host_twins.items() if name not in feed},
                              {name: (array.shape, _dtypes.normalize(array.dtype)) for name, array in feed.items()},
                              self.output_names, self._static_values.setdefault(frozenset(feed), {}),
                              fuse=self.fuse, prepare_weights=self.prepare_weights)
        except NotPlannable as exc:
            return str(exc)

    @property
    def fusion(self) -> dict:
        """What the plans fused, per input signature: FusionReport.as_dict()
        (groups, ops per group, kernels saved, groups that fell back)."""
        return {signature: plan.fusion.as_dict() for signature, plan in self.plans.items()
                if isinstance(plan, Plan) and plan.fusion is not None}


def _deliver(value, given, device: Device, device_outputs: bool):
    """An interpreter's output (an Array or a host value) in the caller's ``given`` array, if any."""
    if given is None:
        return asarray(value, device) if device_outputs else to_numpy(value)
    if tuple(given.shape) != tuple(value.shape) or given.dtype != value.dtype:
        raise ValueError(f"output has shape {tuple(value.shape)} and dtype {value.dtype}; the array given "
                         f"for it has shape {tuple(given.shape)} and dtype {given.dtype}")
    if isinstance(given, Array):
        source = asarray(value, device)
        given.buffer.view(given.offset, given.nbytes).copy_from(source.buffer.view(source.offset, source.nbytes))
    else:
        np.copyto(given, to_numpy(value))
    return given


def prepare(model, device: str | Device | None = None, plan: bool = True,
            fuse: bool | None = None, optimize: bool = True, prepare_weights: bool = True) -> PreparedModel:
    """Check ``model`` (a ModelProto, its bytes or a path) against devkit's op
    set and upload its initializers to ``device``. An op, attribute or dtype
    outside the set raises UnsupportedNodeError naming the node. ``plan``:
    compile each set of input shapes into a plan (see PreparedModel).
    ``fuse``: fuse elementwise chains into generated kernels (docs/fusion.md;
    default: where the plugin has the codegen section); ``fusion`` reports it.
    ``optimize``: the graph rewrites of devkit.onnx.rewrite (BatchNormalization
    folded into Conv; Conv [-> Add] -> Relu as FusedConv where the plugin has
    its kernel), once, for plans and the interpreter alike; ``rewrites``
    reports them. ``prepare_weights``: where a kernel prepares its constant
    inputs (ABI 1.4: packed or widened weights), plans run it on prepared
    copies made once; each plan's ``prepared`` lists them."""
    return PreparedModel(model, device, plan, fuse, optimize, prepare_weights)
