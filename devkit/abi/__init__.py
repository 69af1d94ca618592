"""cffi bindings generated from ``devkit.h``, the only place the ABI is declared.

``ffi`` knows every type, constant and function-pointer signature of the
header. Plugin libraries are opened with :func:`open_library`; the tables they
return are wrapped by :class:`devkit.plugin.Plugin`.
"""

from __future__ import annotations

import re
from pathlib import Path

import cffi

HEADER_PATH = Path(__file__).with_name("devkit.h")
# The plugin-support library (dks.h): C sources compiled into each plugin.
SUPPORT_DIR = Path(__file__).with_name("support")

# Macros the header puts on declarations that mean nothing to cffi.
_ATTRIBUTE_MACROS = ("DK_EXPORT",)
_INTEGER_DEFINE = re.compile(r"#\s*define\s+\w+\s+-?(0x[0-9a-fA-F]+|\d+)[uUlL]*\s*$")


def include_dir() -> str:
    """The directory to put on a C compiler's include path for ``devkit.h``."""
    return str(HEADER_PATH.parent)


def support_dir() -> str:
    """The plugin-support library's directory: its headers (``dks.h``,
    ``dks_kernel.h``) and sources. A plugin puts it on the include path
    beside :func:`include_dir`."""
    return str(SUPPORT_DIR)


def support_sources() -> list[str]:
    """The support library's C sources, to compile into a plugin library
    with the plugin's own (see the top of ``dks.h``)."""
    return [str(path) for path in sorted(SUPPORT_DIR.glob("*.c"))]


def header_to_cdef(text: str) -> str:
    """Turn the C header into declarations cffi can parse.

    Keeps integer ``#define``s, drops ``#ifdef __cplusplus`` blocks and every
    other directive (the include guard, ``#include``, the export macro's
    definition), and removes attribute macros. The header promises to stay
    within these rules.
    """
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = text.replace("\\\n", " ")
    kept: list[str] = []
    # Each open conditional records whether its block is emitted.
    active_stack: list[bool] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            directive = stripped[1:].strip()
            if directive.startswith(("ifdef", "ifndef", "if ")):
                active_stack.append("__cplusplus" not in directive
                                    and "_WIN32" not in directive)
            elif directive.startswith("else"):
                active_stack[-1] = not active_stack[-1] and all(active_stack[:-1])
            elif directive.startswith("endif"):
                active_stack.pop()
            elif all(active_stack) and _INTEGER_DEFINE.match(stripped):
                kept.append(re.sub(r"[uUlL]+\s*$", "", stripped))
            continue
        if all(active_stack):
            kept.append(line)
    cdef = "\n".join(kept)
    for macro in _ATTRIBUTE_MACROS:
        cdef = re.sub(rf"\b{macro}\b", "", cdef)
    return cdef


ffi = cffi.FFI()
ffi.cdef(header_to_cdef(HEADER_PATH.read_text()))

# The header's integer constants and enumerators (DK_OK, DK_DTYPE_FLOAT32, ...),
# read through the process's own symbol namespace.
C = ffi.dlopen(None)

ABI_MAJOR: int = C.DK_ABI_MAJOR
ABI_MINOR: int = C.DK_ABI_MINOR


def open_library(path: str):
    """dlopen a plugin library; raises OSError with the loader's message."""
    return ffi.dlopen(path)


def field_end(struct_type: str, field: str) -> int:
    """Byte offset just past ``field`` in ``struct_type``."""
    field_type = dict(ffi.typeof(struct_type).fields)[field].type
    return ffi.offsetof(struct_type, field) + ffi.sizeof(field_type)


def field_present(cdata, struct_type: str, field: str) -> bool:
    """Whether ``field`` lies inside the writer's ``struct_size`` (VERSIONING rule 3)."""
    return cdata.struct_size >= field_end(struct_type, field)


def struct_fields(struct_type: str) -> list[str]:
    """Field names of a header struct, in declaration order."""
    return [name for name, _ in ffi.typeof(struct_type).fields]
