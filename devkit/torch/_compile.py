"""``torch.compile(model, backend="devkit")``: aot_autograd with torch's core-ATen
decompositions; each FX graph then runs as one devkit plan (``_graph``), or,
where it cannot be planned, op by op, every aten node calling its devkit
lowering directly (no dispatcher or autograd on the way).

``options={"fuse": False}`` keeps every call of a plan; by default a plan is
fused where the plugin has the codegen section (engine.fusion)."""

from __future__ import annotations

import functools
import sys

import torch
from torch._decomp import core_aten_decompositions
from torch.fx.node import map_arg

from . import _aten, _dispatch, _graph, _replay


def _has_devkit_tensor(values) -> bool:
    for value in values:
        if _aten.is_devkit(value) or (isinstance(value, (list, tuple)) and _has_devkit_tensor(value)):
            return True
    return False


OPTIONS = ("fuse",)


def compile_graph(graph_module: torch.fx.GraphModule, example_inputs, fuse: bool | None = None):
    """A boxed callable running ``graph_module`` on devkit: as one plan per input
    geometry where it can be planned (``_graph``), else node by node. ``fuse``:
    as GraphPlan's (None: where the plugin has the codegen section)."""
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
    plans: dict = {}  # input key -> GraphPlan, or None where the graph cannot be planned

    def run_nodes(args, recorder=None):
        env = dict(zip(placeholders, args))
        lookup = env.__getitem__
        for node, target, direct in steps:
            if target is None:
                env[node] = direct
                if recorder is not None and _aten.is_devkit(direct):
                    recorder.add_constant(direct)
                continue
            node_args = map_arg(node.args, lookup)
            node_kwargs = map_arg(node.kwargs, lookup)
            if recorder is not None and target in _graph.CONSTANT_FACTORIES:
                with _replay.recording(None):  # runs once: the plan keeps the result
                    env[node] = value = target(*node_args, **node_kwargs)
                recorder.add_constant(value)
            elif direct is not None and _has_devkit_tensor(node_args):
                env[node] = direct(*node_args, **node_kwargs)
            else:
                env[node] = target(*node_args, **node_kwargs)
        return map_arg(output.args[0], lookup)

    def run(args):
        inputs = list(args)
        args.clear()  # boxed: the inputs die as soon as the graph is done with them
        key = _graph.input_key(inputs)
        if key is None:
            return run_nodes(inputs)
        plan = plans.get(key, False)
        if plan:
            return plan.run(inputs)
        if plan is None:
            return run_nodes(inputs)
        with _replay.recording(_graph.GraphRecorder(inputs)) as recorder:
            results = run_nodes(inputs, recorder)
        try:
            plans[key] = _graph.GraphPlan(recorder, list(results), fuse)
        except _graph.NotPlannable:
            plans[key] = None
        return results

    run._boxed_call = True
    run.plans = plans
    return run


def devkit_backend(graph_module: torch.fx.GraphModule, example_inputs, options: dict | None = None):
    """The "devkit" torch.compile backend (found through the torch_dynamo_backends entry point).
    ``options`` (torch.compile's): ``fuse`` (bool) runs the fusion pass over each plan, or not."""
    from torch._dynamo.backends.common import aot_autograd

    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"devkit backend: unknown option(s) {', '.join(map(repr, unknown))}; "
                         f"it takes {', '.join(map(repr, OPTIONS))}")
    fuse = options.get("fuse")
    if fuse is not None and not isinstance(fuse, bool):
        raise TypeError(f"devkit backend: option 'fuse' must be a bool, got {type(fuse).__name__}")
    if fuse not in _aot:
        compiler = functools.partial(compile_graph, fuse=fuse)
        _aot[fuse] = aot_autograd(fw_compiler=compiler, bw_compiler=compiler,
                                  decompositions=core_aten_decompositions())
    return _aot[fuse](graph_module, example_inputs)


_aot: dict = {}  # per value of the fuse option


def register_backend() -> None:
    """Registers the backend where torch._dynamo is loaded already (importing it takes seconds;
    otherwise torch finds the backend through devkit's entry point when torch.compile asks)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None and "devkit" not in dynamo.list_backends(exclude_tags=()):
        dynamo.register_backend(name="devkit")(devkit_backend)
