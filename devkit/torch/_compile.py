"""``torch.compile(model, backend="devkit")``: aot_autograd with torch's core-ATen
decompositions, then each FX graph run op by op on devkit."""

from __future__ import annotations

import torch
from torch._decomp import core_aten_decompositions


def _run_graph(graph_module: torch.fx.GraphModule, example_inputs):
    return graph_module.forward


def register_backend() -> None:
    from torch._dynamo import list_backends, register_backend as register
    from torch._dynamo.backends.common import aot_autograd

    if "devkit" in list_backends(exclude_tags=()):
        return
    register(name="devkit")(aot_autograd(fw_compiler=_run_graph, bw_compiler=_run_graph,
                                          decompositions=core_aten_decompositions()))
