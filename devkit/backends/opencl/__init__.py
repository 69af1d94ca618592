"""The devkit "opencl" reference plugin: a Python plugin on pyopencl, presented
to the host through the same DK_PluginInit / DK_DeviceApi table as a C plugin.

``dk_plugin_init`` is a cffi DK_PluginInitFn; devkit.load_plugin("opencl")
initialises it like any library's DK_PluginInit. Its kernels are the kernel
library's (devkit.backends.kernels), which the cuda plugin launches too and
which imports without pyopencl. See docs/opencl.md.
"""

from .table import dk_plugin_init

__all__ = ["dk_plugin_init"]
