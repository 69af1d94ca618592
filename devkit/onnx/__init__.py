"""ONNX on devkit: ONNX models and nodes run as devkit ops on any plugin.

``devkit.onnx.prepare(model, device="cpu")`` checks a model against the op
set and returns a PreparedModel whose ``run(inputs)`` maps NumPy inputs to
NumPy outputs; ``devkit.onnx.Backend`` is the same as an ONNX backend."""

from .model import PreparedModel, check_model, load, prepare
from .nodes import InvalidModelError, UnsupportedNodeError, check_node, node_attributes, onnx_dtype, run_nodes, to_numpy


def __getattr__(name):
    if name in ("Backend", "BackendRep"):  # imports onnx.backend, which is slow: on first use
        from . import backend

        return getattr(backend, name)
    raise AttributeError(name)


__all__ = ["Backend", "BackendRep", "InvalidModelError", "PreparedModel", "UnsupportedNodeError", "check_model", "check_node", "load",
           "node_attributes", "onnx_dtype", "prepare", "run_nodes", "to_numpy"]
