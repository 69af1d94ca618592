"""The devkit "cuda" reference plugin: a Python plugin on CuPy, presented to
the host through the same DK_PluginInit / DK_DeviceApi table as a C plugin.

Importable without CuPy: DK_PluginInit then answers DK_UNAVAILABLE with the
reason (no CuPy, no driver, no device). See docs/cuda.md.
"""

from .table import dk_plugin_init

__all__ = ["dk_plugin_init"]
