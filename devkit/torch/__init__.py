"""PyTorch on any devkit plugin: torch tensors of device type ``devkit``.

    import devkit.torch
    devkit.torch.register("opencl")          # a plugin name or library path
    x = torch.randn(3, device="devkit")     # lives on the plugin's device 0
    model.to("devkit"); loss.backward(); optimizer.step()
    compiled = torch.compile(model, backend="devkit")

See docs/pytorch.md. Needs ``pip install 'devkit[torch]'``.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("devkit.torch needs PyTorch: pip install 'devkit[torch]'") from exc

from ._dispatch import implementation, supported_ops
from . import _memory, _replay
from ._memory import DEVICE_TYPE, Unsupported, live_allocations, to_array, wrap
from ._devices import registered_device
from ._registry import register


def collect() -> int:
    """Drop the devkit allocations of storages torch no longer holds, and the
    replay templates (the constants they keep on the device, in every thread); returns how many allocations."""
    _replay.clear()
    return _memory.collect()


def from_array(array):
    """A devkit torch tensor viewing a devkit Array of the registered device (no copy)."""
    if array.device.plugin is not registered_device().plugin:
        raise ValueError(f"array is on {array.device}, devkit.torch is registered on plugin "
                         f"'{registered_device().plugin.name}'")
    return wrap(array)


__all__ = ["DEVICE_TYPE", "Unsupported", "collect", "from_array", "implementation", "live_allocations", "register",
           "registered_device", "supported_ops", "to_array"]
