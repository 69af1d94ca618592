"""Plan-time graph rewrites of devkit.onnx.prepare, done once per model.

Two rewrites, as onnxruntime's session makes them (its Conv-BatchNormalization
fusion and its FusedConv):

- **BatchNormalization folded into the Conv feeding it.** An inference
  BatchNormalization (training_mode 0) of a Conv's output is a per-channel
  affine map, so it goes into the Conv's weights:
  ``s = scale / sqrt(var + epsilon)``, ``W' = W * s`` (per output channel),
  ``B' = (B - mean) * s + bias`` (B = 0 when the Conv has none), computed
  in float64 and rounded once to the weights' dtype. It applies when W, the
  Conv's B and the four BatchNormalization parameters are initializers that
  are not also graph inputs (a feed may override those), and the Conv's
  output is read by the BatchNormalization alone and is not a graph output.
- **Conv [-> Add] -> Relu as one FusedConv** (domain devkit): the Add of a
  Conv's output and another value Z of the same shape (ONNX's inferred
  shapes, symbolic dims compared by name), then Relu. Each intermediate
  must have that one consumer and not be a graph output. It applies only
  where the device's plugin has a native FusedConv kernel at the Conv's
  dtype: elsewhere the Add and Relu stay, for the fusion pass to fuse them
  into one generated kernel (docs/fusion.md).

Numerics: a folded Conv is the Conv of W' = W * s rounded once, so its
outputs differ from the unfolded model's by at most the Conv op's tolerance
(computed on W') plus BatchNormalization's own rounding, which the fold
removes. FusedConv adds Z and applies Relu in the Conv's epilogue, in the
same order as the separate nodes, so it is the Conv's tolerance over K + 2
terms (docs/operators.md).

``optimize`` returns the rewritten steps, the initializers they need (the
folded weights added, those no step reads any more dropped) and a
RewriteReport of what was rewritten and of candidates left as they were,
with the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..ops import dispatch
from ..ops import spec as _spec
from .nodes import Step, node_label


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """One rewrite: ``kind`` ("fold_batchnorm" or "fused_conv"), the names of
    the nodes it replaced (graph order) and the name of the node standing for them."""

    kind: str
    nodes: tuple[str, ...]
    result: str

    def as_dict(self) -> dict:
        return {"kind": self.kind, "nodes": list(self.nodes), "result": self.result}


@dataclasses.dataclass
class RewriteReport:
    """What prepare rewrote (``applied``) and which candidates it left, with
    why (``kept``: "node names: reason"); ``enabled`` is False with optimize=False."""

    enabled: bool
    applied: list[Rewrite] = dataclasses.field(default_factory=list)
    kept: list[str] = dataclasses.field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(rewrite.kind == kind for rewrite in self.applied)

    def as_dict(self) -> dict:
        return {"enabled": self.enabled, "folded_batchnorms": self.count("fold_batchnorm"),
                "fused_convs": self.count("fused_conv"), "applied": [r.as_dict() for r in self.applied],
                "kept": list(self.kept)}


@dataclasses.dataclass(frozen=True)
class ValueInfo:
    """What ONNX's inference knows of a value: its dtype (None: unknown) and
    shape (dims as ints or symbolic names, None for unknown ones; None: no shape)."""

    dtype: np.dtype | None
    shape: tuple | None


class _Graph:
    """The steps with who produces and who reads each value."""

    def __init__(self, steps: Sequence[Step], outputs: Sequence[str]):
        self.steps = list(steps)
        self.outputs = set(outputs)
        self.producer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}
        for index, step in enumerate(self.steps):
            for name in step.node.output:
                if name:
                    self.producer[name] = index
            for name in step.node.input:
                if name:
                    self.readers.setdefault(name, []).append(index)

    def sole_reader(self, name: str, reader: int) -> bool:
        """``name`` is read by step ``reader`` alone (once) and is not a graph output."""
        return self.readers.get(name) == [reader] and name not in self.outputs

    def made_by(self, name: str, op: str) -> int | None:
        index = self.producer.get(name)
        if index is None:
            return None
        step = self.steps[index]
        return index if step.spec is not None and step.spec.name == op and step.spec.domain == "" else None


def _unique(stem: str, taken: set) -> str:
    name, n = stem, 1
    while name in taken:
        n += 1
        name = f"{stem}_{n}"
    taken.add(name)
    return name


def _make_step(op: str, inputs: Sequence[str], outputs: Sequence[str], name: str, attrs: dict) -> Step:
    from onnx import helper

    spec = _spec.get(op)
    while inputs and not inputs[-1]:
        inputs = inputs[:-1]
    node = helper.make_node(op, list(inputs), list(outputs), name=name, domain=spec.domain, **attrs)
    return Step(node, spec, dict(attrs))


def fold_batchnorm_weights(w: np.ndarray, b: np.ndarray | None, scale, bias, mean, var,
                           epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """(W', B') of a Conv with the BatchNormalization after it folded in,
    computed in float64 and rounded once to W's dtype."""
    factor = np.asarray(scale, np.float64) / np.sqrt(np.asarray(var, np.float64) + epsilon)
    folded_w = np.asarray(w, np.float64) * factor.reshape((-1,) + (1,) * (w.ndim - 1))
    conv_bias = np.zeros(w.shape[0]) if b is None else np.asarray(b, np.float64)
    folded_b = (conv_bias - np.asarray(mean, np.float64)) * factor + np.asarray(bias, np.float64)
    return folded_w.astype(w.dtype), folded_b.astype(w.dtype)


def _fold_batchnorms(graph: _Graph, constants: dict, taken: set, report: RewriteReport) -> list[Step]:
    steps = list(graph.steps)
    for index, bn in enumerate(graph.steps):
        if bn.spec is None or bn.spec.name != "BatchNormalization" or bn.spec.domain != "":
            continue
        x = bn.node.input[0]
        conv_index = graph.made_by(x, "Conv")
        if conv_index is None:
            continue
        conv = graph.steps[conv_index]
        names = f"{node_label(conv.node)} -> {node_label(bn.node)}"
        attrs = dispatch.resolve_attrs(bn.spec, bn.attrs)
        conv_w, conv_b = (list(conv.node.input) + [""])[1:3]
        params = list(bn.node.input[1:5])
        missing = [name for name in [conv_w, conv_b, *params] if name and name not in constants]
        if attrs["training_mode"]:
            reason = "the BatchNormalization is in training mode"
        elif not graph.sole_reader(x, index):
            reason = f"the Conv's output '{x}' has other readers or is a graph output"
        elif any(name for name in bn.node.output[1:]):
            reason = "the BatchNormalization's running statistics are read"
        elif missing:
            reason = f"'{missing[0]}' is not a constant (an initializer that is not a graph input)"
        elif any(constants[name].shape != (constants[conv_w].shape[0],) for name in params):
            reason = "the BatchNormalization's parameters do not have one value per Conv output channel"
        else:
            reason = None
        if reason is not None:
            report.kept.append(f"{names}: {reason}")
            continue
        w, b = constants[conv_w], constants[conv_b] if conv_b else None
        folded_w, folded_b = fold_batchnorm_weights(w, b, *(constants[name] for name in params), attrs["epsilon"])
        w_name, b_name = _unique(f"{conv_w}_folded", taken), _unique(f"{bn.node.output[0]}_folded_bias", taken)
        constants[w_name], constants[b_name] = folded_w, folded_b
        steps[conv_index] = _make_step("Conv", [conv.node.input[0], w_name, b_name], [bn.node.output[0]],
                                       node_label(conv.node), conv.attrs)
        steps[index] = None
        report.applied.append(Rewrite("fold_batchnorm", (node_label(conv.node), node_label(bn.node)),
                                      node_label(conv.node)))
    return [step for step in steps if step is not None]


def _dtype_of(name: str, constants: Mapping, infos: Mapping[str, ValueInfo]) -> np.dtype | None:
    if name in constants:
        return constants[name].dtype
    info = infos.get(name)
    return info.dtype if info is not None else None


def _same_known_shape(a: str, b: str, infos: Mapping[str, ValueInfo]) -> bool:
    shapes = [infos[n].shape if n in infos else None for n in (a, b)]
    return shapes[0] is not None and shapes[0] == shapes[1] and None not in shapes[0]


def _fusable(graph: _Graph, index: int, infos: Mapping[str, ValueInfo]) -> tuple[list[int], str, str | None] | None:
    """For Relu step ``index``: the Conv [-> Add] steps feeding it, Z ("" for
    none) and why they cannot fuse (None: they can); None where no Conv feeds it."""
    value = graph.steps[index].node.input[0]
    shared = f"'{value}' has other readers or is a graph output"
    if (conv := graph.made_by(value, "Conv")) is not None:
        return [conv], "", None if graph.sole_reader(value, index) else shared
    if (add := graph.made_by(value, "Add")) is None:
        return None
    first = None
    a, b = graph.steps[add].node.input
    for operand, z in ((a, b), (b, a)):
        if (conv := graph.made_by(operand, "Conv")) is None or operand == z:
            continue
        if not graph.sole_reader(value, index):
            why = shared
        elif not graph.sole_reader(operand, add):
            why = f"'{operand}' has other readers or is a graph output"
        elif not _same_known_shape(operand, z, infos):
            why = f"the Add's inputs '{operand}' and '{z}' are not known to have one shape"
        else:
            return [conv, add], z, None
        first = first or ([conv, add], z, why)
    return first


def _fuse_convs(graph: _Graph, constants: dict, infos: Mapping[str, ValueInfo],
                native: Callable[[np.dtype], bool], report: RewriteReport) -> list[Step]:
    steps = list(graph.steps)
    for index, relu in enumerate(graph.steps):
        if relu.spec is None or relu.spec.name != "Relu" or relu.spec.domain != "":
            continue
        found = _fusable(graph, index, infos)
        if found is None:
            continue
        chain, z, why = found
        conv = graph.steps[chain[0]]
        labels = tuple(node_label(graph.steps[i].node) for i in chain + [index])
        dtype = _dtype_of(conv.node.input[1], constants, infos)
        if why is None and (dtype is None or not native(dtype)):
            why = "the plugin has no FusedConv kernel" + ("" if dtype is None else f" for {_spec.dtype_name(dtype)}")
        if why is not None:
            report.kept.append(f"{' -> '.join(labels)}: {why}")
            continue
        x, w, b = (list(conv.node.input) + [""])[:3]
        steps[index] = _make_step("FusedConv", [x, w, b, z], [relu.node.output[0]], labels[0],
                                  {**conv.attrs, "activation": "Relu"})
        for i in chain:
            steps[i] = None
        report.applied.append(Rewrite("fused_conv", labels, labels[0]))
    return [step for step in steps if step is not None]


def optimize(steps: Sequence[Step], initializers: Mapping[str, np.ndarray], graph_inputs: Sequence[str],
             outputs: Sequence[str], infos: Mapping[str, ValueInfo],
             fused_conv_native: Callable[[np.dtype], bool]) -> tuple[list[Step], dict, RewriteReport]:
    """The rewritten steps, their initializers and the report (see the module
    doc). ``fused_conv_native(dtype)``: the device's plugin has a FusedConv
    kernel at ``dtype``."""
    report = RewriteReport(enabled=True)
    overridable = set(graph_inputs)
    constants = {name: array for name, array in initializers.items() if name not in overridable}
    taken = set(initializers) | set(graph_inputs) | {name for step in steps for name in step.node.output}
    folded = _fold_batchnorms(_Graph(steps, outputs), constants, taken, report)
    rewritten = _fuse_convs(_Graph(folded, outputs), constants, infos, fused_conv_native, report)
    read = {name for step in rewritten for name in step.node.input} | set(outputs)
    kept = {name: array for name, array in initializers.items() if name in read or name in overridable}
    kept.update({name: constants[name] for name in constants if name not in initializers and name in read})
    return rewritten, kept, report
