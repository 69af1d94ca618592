"""``devkit new-plugin NAME [DIR]``: write a buildable C plugin project for a new device.

The project's runtime -- devices, memory, copies, asynchronous in-order
streams, timestamped events and the kernel launcher -- is generated from the
cpu reference plugin's sources when the command runs, so it is always the
implementation that the conformance suite certifies, and devkit keeps no
second copy of it. The generation renames identifiers, files, environment
variables and messages after the new device, keeps the non-defect branch of
every ``DEVKIT_DEFECT_*`` block (those build the deliberately broken variants
that test the suite) and leaves out the cpu plugin's collectives. The rest of
the project (plugin.c, an example kernel, the Python packaging, README and CI
workflow) comes from ``templates/``, with ``@key@`` placeholders.
"""

from __future__ import annotations

import re
from pathlib import Path

from .._version import __version__
from ..abi import HEADER_PATH, struct_fields
from ..ops import PRIMITIVES, PRIMITIVES_VERSION, all_specs, get, resolution
from ..ops.primitives import REASONS
from ..ops.spec import dtype_name
from ..plugin import builtin_names

_HERE = Path(__file__).resolve().parent
CPU_DIR = _HERE.parent / "backends" / "cpu"
TEMPLATE_DIR = _HERE / "templates"

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*\Z")

# The cpu plugin's runtime sources -> their paths in the project.
RUNTIME_SOURCES = {
    "cpu_internal.h": "src/{name}_internal.h",
    "runtime.c": "src/runtime.c",
    "stream.c": "src/stream.c",
    "kernel.h": "src/kernel.h",
    "kernel.c": "src/kernel.c",
    "threads.c": "src/threads.c",
    "graph.c": "src/graph.c",
}
# templates/ file -> its path in the project.
TEMPLATES = {
    "plugin.c": "src/plugin.c",
    "relu.c": "src/kernels/relu.c",
    "package_init.py": "src/devkit_plugin_{name}/__init__.py",
    "setup.py": "setup.py",
    "pyproject.toml": "pyproject.toml",
    "MANIFEST.in": "MANIFEST.in",
    "README.md": "README.md",
    "conformance.yml": ".github/workflows/conformance.yml",
    "gitignore": ".gitignore",
}
VENDORED_HEADER = "include/devkit.h"

# The collectives are the DK_DeviceApi functions ccl_unique_id_size ...
# group_end (the header's "OPTIONAL: collectives" section); the template's
# plugin has none, so their cpu_ declarations are left out.
_API_FUNCTIONS = struct_fields("DK_DeviceApi")[1:]
COLLECTIVE_FUNCTIONS = tuple(
    _API_FUNCTIONS[_API_FUNCTIONS.index("ccl_unique_id_size"):_API_FUNCTIONS.index("group_end") + 1])
# Only the cpu plugin's own test builds rename it; plugin.c names the new plugin.
_CPU_ONLY_MACROS = ("CPU_PLUGIN_NAME",)


class NewPluginError(Exception):
    """Why the project cannot be written (a bad name or directory, or cpu
    sources that the generation no longer understands)."""


def check_name(name: str) -> None:
    if not NAME_PATTERN.match(name):
        raise NewPluginError(
            f"invalid plugin name {name!r}: it prefixes the plugin's C identifiers, so it must be a "
            f"lowercase C identifier: a letter a-z, then letters a-z, digits or '_' (e.g. 'myaccel')")
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
    files = {VENDORED_HEADER: HEADER_PATH.read_text()}
    for source, target in RUNTIME_SOURCES.items():
        files[target.format(name=name)] = runtime_source(source, name)
    for template, target in TEMPLATES.items():
        text = (TEMPLATE_DIR / template).read_text()
        files[target.format(name=name)] = fill(text, values, template)
    return files


class _TemplateKernels:
    """The kernel table of the generated project: templates/relu.c's Relu for float32."""

    def kernel_entry(self, op, dtype):
        return object() if (op, str(dtype)) == ("Relu", "float32") else None


def primitive_values() -> dict[str, str]:
    """The README's primitive-set placeholders, from devkit.ops as installed."""
    summary = resolution.primitive_summary(_TemplateKernels())
    rows = [f"| {op} | {', '.join(dtype_name(d) for d in get(op).dtypes)} | {REASONS[op]} |"
            for op in sorted(PRIMITIVES)]
    return {"primitive_count": str(len(PRIMITIVES)), "primitives_version": str(PRIMITIVES_VERSION),
            "pair_count": str(sum(len(s.dtypes) for s in all_specs())),
            "have_primitives": str(len(summary["primitives"])), "decomposed": str(summary["decomposed"]),
            "primitive_rows": "\n".join(rows)}


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


# -- the cpu runtime, made the new plugin's ---------------------------------------


def runtime_source(source: str, name: str) -> str:
    """One cpu runtime source as the new plugin's."""
    text = strip_defects((CPU_DIR / source).read_text(), source)
    if source == "cpu_internal.h":
        text = drop_declarations(text, [f"cpu_{fn}" for fn in COLLECTIVE_FUNCTIONS], _CPU_ONLY_MACROS)
    leftover = re.search(r"ccl_|\bDK_Comm\b", text)
    if leftover:
        line = text.count("\n", 0, leftover.start()) + 1
        raise NewPluginError(
            f"{CPU_DIR / source}:{line}: refers to the collectives ({leftover.group(0)}), which the "
            f"generated plugin leaves out; teach devkit/new_plugin to leave this out too")
    return rename(text, name)


_DIRECTIVE = re.compile(r"\s*#\s*(\w+)\s*(.*)")
_DEFECT_BLOCK = re.compile(r"(DEVKIT_DEFECT_\w+)\s*(?:/\*.*\*/)?\s*")


def strip_defects(text: str, source: str) -> str:
    """Keeps the real branch of every ``#ifdef DEVKIT_DEFECT_X`` / ``#ifndef
    DEVKIT_DEFECT_X`` block (the #else branch of an #ifdef, the first branch
    of an #ifndef) and drops the defect branch and the directives."""
    out = []
    # One entry per open conditional: None for an ordinary one (kept as it
    # is), else whether the current branch of a defect block is the real one.
    stack: list[bool | None] = []
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        visible = all(keep is not False for keep in stack)
        directive = _DIRECTIVE.match(line)
        keyword, rest = directive.groups() if directive else ("", "")
        defect = _DEFECT_BLOCK.fullmatch(rest)
        if keyword in ("ifdef", "ifndef") and defect:
            stack.append(keyword == "ifndef")
            continue
        if keyword in ("if", "ifdef", "ifndef"):
            stack.append(None)
        elif keyword in ("else", "elif") and stack and stack[-1] is not None:
            if keyword == "elif":
                raise NewPluginError(f"{source}:{number}: #elif in a DEVKIT_DEFECT_ block is not understood")
            stack[-1] = not stack[-1]
            continue
        elif keyword == "endif":
            if not stack:
                raise NewPluginError(f"{source}:{number}: #endif without #if")
            if stack.pop() is not None:
                continue
        if not visible:
            continue
        if "DEVKIT_DEFECT_" in line:
            raise NewPluginError(
                f"{source}:{number}: cannot leave out this use of DEVKIT_DEFECT_: only "
                f"'#ifdef DEVKIT_DEFECT_X' and '#ifndef DEVKIT_DEFECT_X' blocks (with an optional "
                f"#else) are understood")
        out.append(line)
    if stack:
        raise NewPluginError(f"{source}: a conditional is not closed with #endif")
    return "".join(out)


# A comment block on lines of its own, ending on the line before what follows.
_ATTACHED_COMMENT = r"(?:^[ \t]*/\*(?:(?!\*/).)*\*/[ \t]*\n)?"


def drop_declarations(text: str, functions, macros) -> str:
    """Leaves out the prototypes of ``functions`` and the ``#ifndef M ...
    #endif`` blocks of ``macros``, each with the comment right above it."""
    for function in functions:
        prototype = rf"^[^;{{}}#\n]*\b{function}\s*\([^;]*\)[^;]*;[ \t]*\n"
        text = re.sub(_ATTACHED_COMMENT + prototype, "", text, flags=re.M | re.S)
    for macro in macros:
        block = rf"^[ \t]*#[ \t]*ifndef[ \t]+{macro}\b(?:(?!#[ \t]*endif).)*#[ \t]*endif[^\n]*\n"
        text = re.sub(_ATTACHED_COMMENT + block, "", text, flags=re.M | re.S)
    return re.sub(r"\n{3,}", "\n\n", text)  # the blank lines around what left


# The cpu plugin's prefixes, not the C library's CPU sets (cpu_set_t, CPU_SET, ...).
CPU_PREFIX_LOWER = r"\bcpu_(?!set_t\b)"
CPU_PREFIX_UPPER = r"\bCPU_(?!(?:SET|CLR|ZERO|COUNT|ISSET|EQUAL|SETSIZE)\b)"


def rename(text: str, name: str) -> str:
    """cpu_internal.h -> NAME_internal.h, cpu_x -> NAME_x, CPU_X -> NAME_X,
    DEVKIT_CPU_X -> NAME_X, and the plugin's name in messages and comments;
    the C library's CPU sets (cpu_set_t, CPU_SET, ...) keep their names."""
    upper = name.upper()
    # Include guards: DEVKIT_BACKENDS_CPU_CPU_INTERNAL_H_ -> NAME_INTERNAL_H_.
    text = re.sub(r"\bDEVKIT_BACKENDS_CPU_(?:CPU_)?(\w+_H_)\b", rf"{upper}_\1", text)
    text = re.sub(r"\bDEVKIT_CPU_", f"{upper}_", text)  # environment variables
    text = re.sub(CPU_PREFIX_LOWER, f"{name}_", text)
    text = re.sub(CPU_PREFIX_UPPER, f"{upper}_", text)
    text = text.replace('"cpu" reference plugin', f'"{name}" plugin')
    return re.sub(r"\bcpu\b", name, text)  # "cpu device 0", "the cpu plugin"
