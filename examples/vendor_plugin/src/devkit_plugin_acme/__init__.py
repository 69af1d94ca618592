"""The devkit plugin for acme devices.

pyproject.toml registers ``library_path`` under the ``devkit.plugins`` entry
point, so ``devkit.load_plugin("acme")`` and ``devkit-conformance acme``
find the library built into this package.
"""

from pathlib import Path


def library_path() -> str:
    """The path of libdevkit_acme.so, which setup.py builds next to this file."""
    return str(Path(__file__).with_name("libdevkit_acme.so"))
