"""The devkit devices behind torch's ``devkit`` device type: device 0 of the
registered plugin (devkit.torch.register), and each thread's current one."""

from __future__ import annotations

import threading

import torch

from ..runtime import Device

registered: Device | None = None  # device 0 of the registered plugin; _registry.register sets it
current = threading.local()  # .index: this thread's current devkit device (torch.devkit.set_device)


def registered_device() -> Device:
    if registered is None:
        raise RuntimeError("devkit.torch.register(plugin) has not been called")
    return registered


def devkit_device(device) -> Device:
    """The devkit Device a torch device argument names (None or ``devkit``: the current one)."""
    plugin = registered_device().plugin
    index = None
    if device is not None:
        index = device if isinstance(device, int) else torch.device(device).index
    if index is None:
        index = getattr(current, "index", 0)
    if not 0 <= index < plugin.device_count:
        raise RuntimeError(f"devkit:{index} does not exist: plugin '{plugin.name}' has "
                           f"{plugin.device_count} device{'s' if plugin.device_count != 1 else ''} "
                           f"(devkit:0 to devkit:{plugin.device_count - 1})")
    return registered_device() if index == 0 else plugin.device(index)
