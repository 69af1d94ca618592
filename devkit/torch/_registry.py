"""Registers devkit as torch's PrivateUse1 backend, named ``devkit``."""

from __future__ import annotations

import os
import threading

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from ..plugin import Plugin, load_plugin
from ..runtime import Device
from . import _compile, _devices, _dispatch, _memory, _replay
from ._devices import devkit_device, registered_device

_lock = threading.Lock()
_libraries: list = []  # torch unregisters kernels when their Library dies


class _BackendModule:
    """``torch.devkit``: what torch asks of a device module."""

    @staticmethod
    def is_available() -> bool:
        return _devices.registered is not None

    @staticmethod
    def is_initialized() -> bool:
        return _devices.registered is not None

    @staticmethod
    def device_count() -> int:
        return registered_device().plugin.device_count if _devices.registered is not None else 0

    @staticmethod
    def current_device() -> int:
        return getattr(_devices.current, "index", 0)

    @staticmethod
    def set_device(device) -> None:
        _devices.current.index = devkit_device(device).index

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        """Random numbers come from torch's CPU generator, which torch.manual_seed seeds."""

    @staticmethod
    def synchronize(device=None) -> None:
        devkit_device(device).synchronize()

    @staticmethod
    def get_amp_supported_dtype():
        return [torch.float16, torch.bfloat16]


def register(plugin: str | os.PathLike | Plugin = "cpu") -> Device:
    """Make ``plugin``'s devices torch's ``devkit:0``, ``devkit:1``, ...; returns device 0.

    ``plugin`` is a plugin name, the path of its library or a loaded Plugin. Registering again
    with another plugin moves where new tensors go; tensors made before stay on
    their plugin (an op mixing the two raises an error naming both devices).
    """
    with _lock:
        dev = (plugin if isinstance(plugin, Plugin) else load_plugin(plugin)).device(0)
        if _devices.registered is not None:
            _devices.registered = dev
            _replay.clear()  # devkit:0 is another device now
            return dev
        if torch._C._get_privateuse1_backend_name() not in ("privateuseone", _memory.DEVICE_TYPE):
            raise RuntimeError(f"torch's PrivateUse1 backend is already "
                               f"'{torch._C._get_privateuse1_backend_name()}'")
        _setup_privateuseone_for_python_backend(_memory.DEVICE_TYPE, backend_module=_BackendModule())
        _memory.use_native()
        _library = torch.library.Library("_", "IMPL")
        _library.fallback(_dispatch.kernel, "PrivateUse1")
        _libraries.extend([_library, _kernels()])
        _devices.registered = dev
        _compile.register_backend()
        return dev


def _kernels() -> torch.library.Library:
    """PrivateUse1 kernels of their own for the ops devkit runs: without one, torch's default
    kernel of a structured op (add.Tensor) would allocate and call its out= form, and the
    default of convolution_overrideable raises."""
    kernels = torch.library.Library("aten", "IMPL")
    for op in _dispatch.direct_kernel_ops():
        kernels.impl(op, _dispatch.kernel_for(op), "PrivateUse1")
    return kernels
