"""The devkit plugin for @name@ devices.

pyproject.toml registers ``library_path`` under the ``devkit.plugins`` entry
point, so ``devkit.load_plugin("@name@")`` and ``devkit-conformance @name@``
find the library built into this package.
"""

from pathlib import Path


def library_path() -> str:
    """The path of libdevkit_@name@.so, which setup.py builds next to this file."""
    return str(Path(__file__).with_name("libdevkit_@name@.so"))
