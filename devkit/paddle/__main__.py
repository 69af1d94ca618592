"""``python -m devkit.paddle --root``: builds the bridge if needed and prints its directory
(the value for CUSTOM_DEVICE_ROOT)."""

import argparse

from ._build import library_dir

parser = argparse.ArgumentParser(prog="python -m devkit.paddle", description=__doc__)
parser.add_argument("--root", action="store_true", help="print the directory to put in CUSTOM_DEVICE_ROOT")
arguments = parser.parse_args()
if arguments.root:
    print(library_dir())
else:
    parser.print_help()
