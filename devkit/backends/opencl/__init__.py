"""The devkit "opencl" reference plugin: a Python plugin on pyopencl, presented
to the host through the same DK_PluginInit / DK_DeviceApi table as a C plugin.

``dk_plugin_init`` is a cffi DK_PluginInitFn; devkit.load_plugin("opencl")
initialises it like any library's DK_PluginInit. See docs/opencl.md.

The kernel families (kernels.py and the modules built on it) import without
pyopencl: the cuda plugin launches the same kernels, so the table (and
pyopencl) is imported only when ``dk_plugin_init`` is asked for.
"""

__all__ = ["dk_plugin_init"]


def __getattr__(name: str):
    if name == "dk_plugin_init":
        from .table import dk_plugin_init

        return dk_plugin_init
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
