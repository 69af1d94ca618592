"""What the plugins written in Python (opencl, cuda) share, as C plugins
share devkit/abi/support: ``boundary`` (statuses raised as exceptions, the
C-boundary wrapper of every table function, DK_PluginInit),
``graph_capture`` (what their graph sections have in common)."""
