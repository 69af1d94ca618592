"""``devkit new-plugin NAME [DIR]``: write a buildable C plugin project for a new device.

The project holds only the code a vendor owns: ``src/plugin.c``
(``DK_PluginInit``), the device hooks (``src/hooks.h``, ``src/hooks.c``: host
memory until the driver's calls go in) and ``src/kernels/`` (Relu and Add for
float32, as examples), with its Python packaging, README and CI workflow.
The rest of the plugin -- streams, events, handle tables, the kernel
launcher, graphs, the thread pool -- is devkit's plugin-support library
(``devkit/abi/support/``), which the project's setup.py compiles in from the
installed devkit at each build, so a plugin rebuilt after an upgrade of
devkit has the library's fixes. The files come from ``templates/``, with
``@key@`` placeholders.
"""

from __future__ import annotations

import re
from pathlib import Path

from .._version import __version__
from ..ops import PRIMITIVES, PRIMITIVES_VERSION, all_specs, get, resolution
from ..ops.primitives import REASONS
from ..ops.spec import dtype_name
from ..plugin import builtin_names

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*\Z")

# templates/ file -> its path in the project.
TEMPLATES = {
    "plugin.c": "src/plugin.c",
    "hooks.h": "src/hooks.h",
    "hooks.c": "src/hooks.c",
    "relu.c": "src/kernels/relu.c",
    "add.c": "src/kernels/add.c",
    "package_init.py": "src/devkit_plugin_{name}/__init__.py",
    "setup.py": "setup.py",
    "pyproject.toml": "pyproject.toml",
    "MANIFEST.in": "MANIFEST.in",
    "README.md": "README.md",
    "conformance.yml": ".github/workflows/conformance.yml",
    "gitignore": ".gitignore",
}


class NewPluginError(Exception):
    """Why the project cannot be written (a bad name or directory, or a
    template with a placeholder that the generation does not know)."""


def check_name(name: str) -> None:
    if not NAME_PATTERN.match(name):
        raise NewPluginError(
            f"invalid plugin name {name!r}: it prefixes the plugin's C identifiers, so it must be a "
            f"lowercase C identifier: a letter a-z, then letters a-z, digits or '_' (e.g. 'myaccel')")
    if name == "dks" or name.startswith("dks_"):
        raise NewPluginError(
            f"invalid plugin name {name!r}: dks_ is the prefix of devkit's plugin-support library, "
            f"whose identifiers the plugin's would collide with")
    if name in builtin_names():
        raise NewPluginError(
            f"invalid plugin name {name!r}: a devkit built-in plugin has that name "
            f"(taken: {', '.join(builtin_names())})")


def default_directory(name: str) -> Path:
    return Path(f"devkit-plugin-{name}")


def render(name: str) -> dict[str, str]:
    """The project's files: relative path -> text."""
    check_name(name)
    values = {"name": name, "NAME": name.upper(), "devkit_version": __version__, **primitive_values()}
    files = {}
    for template, target in TEMPLATES.items():
        text = (TEMPLATE_DIR / template).read_text()
        files[target.format(name=name)] = fill(text, values, template)
    return files


# A kernel template's table entries: {"Relu", DK_DTYPE_FLOAT32, ...}.
_KERNEL_DEF = re.compile(r'\{"(\w+)", DK_DTYPE_(\w+),')


class _TemplateKernels:
    """The kernel table of the generated project: what its kernel templates register."""

    def __init__(self):
        self.entries = {(op, dtype.lower())
                        for template, target in TEMPLATES.items() if target.startswith("src/kernels/")
                        for op, dtype in _KERNEL_DEF.findall((TEMPLATE_DIR / template).read_text())}

    def kernel_entry(self, op, dtype):
        return object() if (op, str(dtype)) in self.entries else None


def primitive_values() -> dict[str, str]:
    """The README's primitive-set placeholders, from devkit.ops as installed."""
    kernels = _TemplateKernels()
    summary = resolution.primitive_summary(kernels)
    ops_by_dtype: dict[str, list[str]] = {}
    for op, dtype in sorted(kernels.entries):
        ops_by_dtype.setdefault(dtype, []).append(op)
    rows = [f"| {op} | {', '.join(dtype_name(d) for d in get(op).dtypes)} | {REASONS[op]} |"
            for op in sorted(PRIMITIVES)]
    return {"primitive_count": str(len(PRIMITIVES)), "primitives_version": str(PRIMITIVES_VERSION),
            "pair_count": str(sum(len(s.dtypes) for s in all_specs())),
            "have_primitives": str(len(summary["primitives"])), "decomposed": str(summary["decomposed"]),
            "primitive_rows": "\n".join(rows),
            "kernels": "; ".join(f"{' and '.join(ops)} for {dtype}" for dtype, ops in sorted(ops_by_dtype.items()))}


def generate(name: str, directory: Path | None = None, force: bool = False) -> list[Path]:
    """Write the project for device ``name`` into ``directory`` (default
    ./devkit-plugin-NAME); returns the files written."""
    files = render(name)
    directory = default_directory(name) if directory is None else Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NewPluginError(f"{directory} exists and is not a directory")
    if directory.is_dir() and any(directory.iterdir()) and not force:
        raise NewPluginError(
            f"{directory} is not empty; choose another directory, or pass --force to write the "
            f"project's files over what is there")
    written = []
    for relative, text in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def fill(text: str, values: dict[str, str], source: str) -> str:
    """Replaces every @key@ placeholder of a template."""

    def value(match: re.Match) -> str:
        if match.group(1) not in values:
            raise NewPluginError(f"template {source}: unknown placeholder {match.group(0)}")
        return values[match.group(1)]

    return re.sub(r"@(\w+)@", value, text)
