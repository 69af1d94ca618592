"""PaddlePaddle on any devkit plugin: the CustomDevice bridge (docs/paddle.md).

    import devkit.paddle          # before paddle: builds the bridge once, sets the environment
    import paddle
    paddle.set_device("devkit:0") # device 0 of the plugin DEVKIT_PADDLE_PLUGIN names (default cpu)

Importing this module sets, where unset or empty, CUSTOM_DEVICE_ROOT (the
directory of the bridge library, built on first use against the installed
paddle wheel) and DEVKIT_PADDLE_PLUGIN (cpu). Paddle reads CUSTOM_DEVICE_ROOT
when it is imported, so import this first; ``python -m devkit.paddle --root``
prints the directory for shells that set the variables themselves.
"""

from __future__ import annotations

import collections
import os
import sys
import warnings

from ._build import BuildError, library_dir
from . import _bridge
from ._bridge import DEFAULT_PLUGIN, PLUGIN_ENV, kernel_counts as _kernel_counts

DEVICE_TYPE = "devkit"
ROOT_ENV = "CUSTOM_DEVICE_ROOT"

__all__ = ["BuildError", "DEVICE_TYPE", "kernel_counts", "library_dir", "setup"]


def setup() -> str:
    """Builds the bridge if needed and sets CUSTOM_DEVICE_ROOT and DEVKIT_PADDLE_PLUGIN
    where unset; returns the bridge's directory."""
    root = str(library_dir())
    before = os.environ.get(ROOT_ENV)
    if not before:  # unset, or the empty value paddle's import leaves
        os.environ[ROOT_ENV] = root
    if not os.environ.get(PLUGIN_ENV):
        os.environ[PLUGIN_ENV] = DEFAULT_PLUGIN
    if "paddle" in sys.modules and before != root:
        warnings.warn("devkit.paddle was imported after paddle: Paddle has already looked for custom "
                      "devices, so 'devkit' is not one; import devkit.paddle first", RuntimeWarning, stacklevel=3)
    return root


def kernel_counts() -> dict[str, int]:
    """Calls of each devkit kernel so far in this process (ops Paddle ran on the devkit device),
    through Python and straight to the plugin's kernel table (bridge.cc) alike."""
    counts = collections.Counter(_kernel_counts)
    if hasattr(_bridge, "direct_calls"):  # bridge.cc adds it once Paddle has loaded the bridge
        counts.update(_bridge.direct_calls())
    return dict(counts)


setup()
