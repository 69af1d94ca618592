"""ONNX NodeProto -> devkit.run_op: attribute conversion and a sequential
node runner (the nodes of a graph, in the topological order ONNX requires)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from .. import dtypes as _dtypes
from ..ops import dispatch
from ..ops import spec as _spec
from ..runtime import Array, Device


class UnsupportedNodeError(ValueError):
    """A node that devkit cannot run: an op, domain, attribute or dtype outside the set."""


class InvalidModelError(ValueError):
    """A model that is not valid ONNX: a cycle, a value nothing produces or two
    nodes produce, a Constant without exactly one value attribute, a node
    without outputs."""


def onnx_dtype(elem_type: int) -> np.dtype:
    """The NumPy dtype of an ONNX TensorProto element type devkit arrays carry."""
    from onnx import TensorProto

    try:
        return _dtypes.from_onnx(elem_type)
    except ValueError:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        raise UnsupportedNodeError(f"element type {name} is not a devkit dtype") from None


@dataclasses.dataclass(frozen=True)
class Step:
    """One node, checked: its spec and attributes, or for a Constant (spec
    None) its value."""

    node: object
    spec: _spec.OpSpec | None
    attrs: dict
    constant: np.ndarray | None = None


def node_label(node) -> str:
    """The node's name, or for a nameless node the name of its first output."""
    return node.name or next((output for output in node.output if output), "")


def _describe(node, index: int | None = None) -> str:
    """The node by its index in the graph (where known) and its name, or for
    a nameless node the name of its first output."""
    name = node_label(node)
    where = "node" if index is None else f"node {index}"
    return f"{where} '{name}' ({node.op_type})" if name else f"{where} ({node.op_type}, nameless)"


def node_attributes(node, spec: _spec.OpSpec) -> dict:
    """The node's attributes as run_op takes them.

    ONNX dtype codes become dtypes where the spec declares a dtype attribute;
    a one-element tensor attribute (ConstantOfShape's value) becomes a scalar,
    and its element type fills the spec's ``dtype`` attribute unless set."""
    from onnx import AttributeProto, helper, numpy_helper

    attrs: dict = {}
    tensor_dtype = None
    for proto in node.attribute:
        declared = spec.attr(proto.name)
        if declared is None and proto.name not in spec.host_inputs:  # (older forms of host inputs pass)
            raise UnsupportedNodeError(f"{_describe(node)}: attribute '{proto.name}' is not supported")
        if proto.type == AttributeProto.TENSOR:
            array = numpy_helper.to_array(proto.t)
            if array.size != 1:
                raise UnsupportedNodeError(f"{_describe(node)}: tensor attribute '{proto.name}' must hold one value")
            tensor_dtype = onnx_dtype(proto.t.data_type)
            value = array.reshape(-1)[0].item()
        elif proto.type in (AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.STRING,
                            AttributeProto.INTS, AttributeProto.FLOATS):
            value = helper.get_attribute_value(proto)
        else:
            kind = AttributeProto.AttributeType.Name(proto.type)
            raise UnsupportedNodeError(f"{_describe(node)}: attribute '{proto.name}' of type {kind} is not supported")
        if declared is not None and declared.kind == "dtype" and isinstance(value, int):
            value = onnx_dtype(value)
        attrs[proto.name] = value
    dtype_attr = spec.attr("dtype")
    if tensor_dtype is not None and dtype_attr is not None and dtype_attr.kind == "dtype":
        attrs.setdefault("dtype", tensor_dtype)
    if node.op_type == "Split" and (len(node.input) < 2 or not node.input[1]):
        # Before opset 18 an equal Split takes its part count from the node's outputs.
        attrs.setdefault("num_outputs", len(node.output))
    return attrs


def _constant(node) -> np.ndarray:
    from onnx import helper, numpy_helper

    if len(node.attribute) != 1:
        given = ", ".join(f"'{proto.name}'" for proto in node.attribute) or "none"
        raise InvalidModelError(f"{_describe(node)}: a Constant has exactly one value attribute (value, "
                                f"value_float, value_ints, ...); this one has {given}")
    (proto,) = node.attribute
    if proto.name == "value":
        return numpy_helper.to_array(proto.t)
    value = helper.get_attribute_value(proto)
    dtype = {"value_float": np.float32, "value_floats": np.float32,
             "value_int": np.int64, "value_ints": np.int64}.get(proto.name)
    if dtype is None:
        raise UnsupportedNodeError(f"{_describe(node)}: Constant with '{proto.name}' is not supported")
    return np.asarray(value, dtype)


def check_node(node) -> _spec.OpSpec | None:
    """The node's spec (None for Constant, which the runner folds on the host),
    or UnsupportedNodeError naming what is outside the set."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    if node.op_type == "Constant" and domain == "":
        return None
    try:
        spec = _spec.get(node.op_type)
    except ValueError:
        raise UnsupportedNodeError(f"{_describe(node)}: op {node.op_type} is not in the devkit operator set") from None
    if spec.domain != domain:
        raise UnsupportedNodeError(f"{_describe(node)}: devkit has {node.op_type} in domain "
                                   f"'{spec.domain or 'ai.onnx'}', not '{node.domain}'")
    node_attributes(node, spec)
    return spec


def run_nodes(nodes: Sequence, values: Mapping[str, object], device: str | Device) -> dict:
    """Run ``nodes`` in order on ``device``. ``values`` maps tensor names to
    NumPy arrays or devkit Arrays; the result adds every node output."""
    env = dict(values)
    for node in nodes:
        spec = check_node(node)
        if spec is None:
            env[node.output[0]] = _constant(node)
            continue
        inputs = [env[name] if name else None for name in node.input]
        outputs = dispatch.run_op(node.op_type, inputs, node_attributes(node, spec), device=device,
                                  outputs=dispatch.outputs_named(node.output))
        for name, output in zip(node.output, outputs):
            if name:
                env[name] = output
    return env


def to_numpy(value) -> np.ndarray:
    return value.numpy() if isinstance(value, Array) else np.asarray(value)
