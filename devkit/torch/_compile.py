"""``torch.compile(model, backend="devkit")``: aot_autograd with torch's core-ATen
decompositions; each FX graph then runs op by op, every aten node calling its
devkit lowering directly (no dispatcher or autograd on the way)."""

from __future__ import annotations

import sys

import torch
from torch._decomp import core_aten_decompositions
from torch.fx.node import map_arg

from . import _aten, _dispatch


def _has_devkit_tensor(values) -> bool:
    for value in values:
        if _aten.is_devkit(value) or (isinstance(value, (list, tuple)) and _has_devkit_tensor(value)):
            return True
    return False


def compile_graph(graph_module: torch.fx.GraphModule, example_inputs):
    """A boxed callable running ``graph_module``'s nodes in order on devkit."""
    nodes = list(graph_module.graph.nodes)
    steps = []
    for node in nodes:
        if node.op == "call_function":
            target = node.target
            direct = _dispatch.implementation(target) if isinstance(target, torch._ops.OpOverload) else None
            steps.append((node, target, direct))
        elif node.op == "get_attr":
            steps.append((node, None, getattr(graph_module, node.target)))
    placeholders = [n for n in nodes if n.op == "placeholder"]
    output = next(n for n in nodes if n.op == "output")

    def run(args):
        env = dict(zip(placeholders, args))
        args.clear()  # boxed: the inputs die as soon as the graph is done with them
        lookup = env.__getitem__
        for node, target, direct in steps:
            if target is None:
                env[node] = direct
                continue
            node_args = map_arg(node.args, lookup)
            node_kwargs = map_arg(node.kwargs, lookup)
            if direct is not None and _has_devkit_tensor(node_args):
                env[node] = direct(*node_args, **node_kwargs)
            else:
                env[node] = target(*node_args, **node_kwargs)
        return map_arg(output.args[0], lookup)

    run._boxed_call = True
    return run


def devkit_backend(graph_module: torch.fx.GraphModule, example_inputs):
    """The "devkit" torch.compile backend (found through the torch_dynamo_backends entry point)."""
    from torch._dynamo.backends.common import aot_autograd

    global _aot
    if _aot is None:
        _aot = aot_autograd(fw_compiler=compile_graph, bw_compiler=compile_graph,
                            decompositions=core_aten_decompositions())
    return _aot(graph_module, example_inputs)


_aot = None


def register_backend() -> None:
    """Registers the backend where torch._dynamo is loaded already (importing it takes seconds;
    otherwise torch finds the backend through devkit's entry point when torch.compile asks)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None and "devkit" not in dynamo.list_backends(exclude_tags=()):
        dynamo.register_backend(name="devkit")(devkit_backend)
