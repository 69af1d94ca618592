"""What the plugins written in Python (opencl, cuda) share: ``boundary``
(statuses raised as exceptions, the C-boundary wrapper of every table
function, DK_PluginInit), ``table`` (the DK_DeviceApi table each plugin
fills from a narrow set of device hooks) and ``graph_capture`` (what their
graph sections have in common)."""
