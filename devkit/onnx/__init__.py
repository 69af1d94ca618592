"""ONNX on devkit: ONNX nodes run as devkit ops on any plugin."""

from .nodes import UnsupportedNodeError, check_node, node_attributes, onnx_dtype, run_nodes, to_numpy

__all__ = ["UnsupportedNodeError", "check_node", "node_attributes", "onnx_dtype", "run_nodes", "to_numpy"]
