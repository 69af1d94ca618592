"""devkit as an ONNX backend (onnx.backend.base.Backend), so that the onnx
package's own test runner drives any devkit plugin:

    backend = devkit.onnx.Backend.for_device("opencl:0")
    onnx.backend.test.BackendTest(backend, __name__)

Device strings are devkit's ``plugin:index``; ONNX's generic "CPU" means the
backend's default device (cpu:0 unless bound with for_device)."""

from __future__ import annotations

from typing import Any

import onnx
from onnx.backend.base import Backend as _OnnxBackend
from onnx.backend.base import BackendRep as _OnnxBackendRep

from ..errors import PluginLoadError
from ..runtime import device as _device
from .model import PreparedModel, check_model
from .nodes import InvalidModelError, UnsupportedNodeError, run_nodes, to_numpy


class BackendRep(_OnnxBackendRep):
    def __init__(self, prepared: PreparedModel):
        self.prepared = prepared

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        return tuple(self.prepared.run(inputs))


class Backend(_OnnxBackend):
    default_device = "cpu:0"

    @classmethod
    def for_device(cls, device: str) -> type[Backend]:
        """A Backend class whose "CPU" (and default) device is ``device``."""
        return type(f"Backend_{device.replace(':', '_')}", (cls,), {"default_device": device})

    @classmethod
    def _resolve(cls, device: str) -> str:
        return cls.default_device if device.upper() in ("CPU", "") else device

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs: Any) -> bool:
        try:
            check_model(model)
        except (InvalidModelError, UnsupportedNodeError):
            return False
        return True

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> BackendRep:
        onnx.checker.check_model(model)
        return BackendRep(PreparedModel(model, cls._resolve(device)))

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs: Any):
        super().run_node(node, inputs, device, outputs_info, **kwargs)
        values = dict(zip([name for name in node.input if name], [i for i in inputs if i is not None]))
        env = run_nodes([node], values, cls._resolve(device))
        return tuple(to_numpy(env[name]) for name in node.output if name)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            _device(cls._resolve(device))
        except (PluginLoadError, IndexError, ValueError):
            return False
        return True


prepare = Backend.prepare
run_model = Backend.run_model
run_node = Backend.run_node
supports_device = Backend.supports_device
