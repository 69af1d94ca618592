"""The ``devkit`` command: tools for plugin vendors, one subcommand each.

    devkit new-plugin NAME [DIR]    write a buildable C plugin project for device NAME
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import new_plugin


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="devkit", description="devkit's tools for plugin vendors.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    new = commands.add_parser(
        "new-plugin", help="write a buildable C plugin project for a new device",
        description="Write a C plugin project for device NAME: its device hooks (host memory "
                    "until the driver's calls go in), DK_PluginInit and an example kernel, built "
                    "on devkit's plugin-support library, which the build compiles in from the "
                    "installed devkit; a pip-installable build registering the plugin under the "
                    "devkit.plugins entry point, a README and a CI workflow running "
                    "devkit-conformance.")
    new.add_argument("name", metavar="NAME",
                     help="the plugin's name: a lowercase C identifier, e.g. myaccel")
    new.add_argument("directory", metavar="DIR", nargs="?", type=Path,
                     help="where to write the project (default: ./devkit-plugin-NAME)")
    new.add_argument("--force", action="store_true",
                     help="write into DIR even when it is not empty, replacing the project's files")
    new.set_defaults(run=_new_plugin)
    return parser


def _new_plugin(args: argparse.Namespace) -> int:
    directory = args.directory or new_plugin.default_directory(args.name)
    written = new_plugin.generate(args.name, directory, force=args.force)
    print(f"wrote {len(written)} files into {directory}/; next:")
    print(f"  cd {directory}")
    print("  pip install --no-build-isolation .   # builds against the installed devkit")
    print(f"  devkit-conformance {args.name} --suite runtime --suite robustness --suite graphs")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except new_plugin.NewPluginError as exc:
        print(f"devkit {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
