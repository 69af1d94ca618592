"""Every OpenCL C program the kernel library's families (devkit/backends/kernels)
build, for each dtype their ops claim: what the check renders as CUDA C and
compiles.

The programs come from the families' own source builders, found by name
(every module-level function ``*_source`` of a family module) and called
for the dtypes the ops of their module (or, for a helper module that claims
nothing itself, of its family) register; the few programs a kernel builds
inline are listed in ``_INLINE``. Parameters are filled by name: dtype keys,
element widths, ``fp64`` (every CUDA device has it) and a Call stand-in for
the builders that take one. A builder's options (``-DWG=...``, the tile
sizes of the tiled product) are the opencl launch's, for a GPU.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import itertools
import pkgutil
from collections.abc import Iterator

from ...abi import C
from .. import kernels
from ..kernels import layer, linalg_gemm, training_common, training_conv, training_rows
from ..kernels.layer import CL_TYPES, prelude
from ..kernels.training_common import NO_CONTRACT
from ..support.boundary import PluginError
from .table import device_table

KERNELS = "devkit.backends.kernels"
# Parameters holding the dtype of the op's key input, of a second operand
# (parameters, statistics, work type) and of integer indices or labels.
_KEY_PARAMETERS = {"key", "x", "x_key", "src_key"}
_SECOND_PARAMETERS = {"p_key", "s_key", "s", "m", "work_key", "dst_key"}
_INDEX_PARAMETERS = {"index_key", "labels_key"}
_INDEX_KEYS = (C.DK_DTYPE_INT32, C.DK_DTYPE_INT64)
# Builders whose run also serves other programs, so that the dtypes reaching
# them overstate theirs: each takes float dtypes only.
_FLOAT_ONLY = {
    "reduce_arg._softmax_source": "k_softmax's run also launches ArgMax/ArgMin/Hardmax, whose "
                                  "integer dtypes take _arg_source",
}
# Modules of the kernel library that hold no kernel sources.
_NOT_FAMILIES = {"layer"}


@dataclasses.dataclass(frozen=True)
class Program:
    name: str      # "module.builder[dtypes]", for the check's log
    source: str    # OpenCL C
    options: str   # the opencl build options (only -D ones matter to CUDA)


class _CallStandIn:
    """What the source builders that take a Call read of it, and the kernel
    table of a device (which claims float64: every CUDA device has it)."""

    fp64 = True


def _reached(fn, seen: set) -> None:
    """The functions of the kernel library ``fn`` calls, transitively (by the
    global names its code and nested code read)."""
    fn = inspect.unwrap(fn)
    if not inspect.isfunction(fn) or fn in seen or not fn.__module__.startswith(KERNELS):
        return
    seen.add(fn)
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        codes += [const for const in code.co_consts if inspect.iscode(const)]
        for name in code.co_names:
            value = fn.__globals__.get(name)
            if value is not None:
                _reached(value, seen)


def _claims() -> dict[object, set[int]]:
    """The dtype keys each function of the families serves: those of every
    entry of the cuda plugin's kernel table whose run reaches it."""
    served: dict[object, set[int]] = {}
    for _op, key, run in device_table.build_kernel_table([_CallStandIn()]).runs:
        reached: set = set()
        _reached(run, reached)
        for fn in reached:
            served.setdefault(fn, set()).add(key)
    return served


def family_modules() -> list[str]:
    """The kernel library's modules that may hold kernel sources."""
    return sorted(m.name for m in pkgutil.iter_modules(kernels.__path__) if m.name not in _NOT_FAMILIES)


def _builders(module) -> Iterator[tuple[str, object]]:
    for name, value in vars(module).items():
        fn = getattr(value, "__wrapped__", value)
        if (name.endswith("_source") and inspect.isfunction(fn)
                and fn.__module__ == module.__name__):
            yield name, value


def _arguments(fn, keys: list[int], itemsizes: list[int]) -> Iterator[tuple[list, str]]:
    choices, labels = [], []
    for parameter in inspect.signature(fn).parameters:
        if parameter == "c":
            choices.append([_CallStandIn()])
        elif parameter == "fp64":
            choices.append([True])
        elif parameter == "itemsize":
            choices.append(itemsizes)
            labels.append(parameter)
        elif parameter in _KEY_PARAMETERS:
            choices.append(keys)
            labels.append(parameter)
        elif parameter in _SECOND_PARAMETERS:
            choices.append(None)  # the key's own dtype, and float32
            labels.append(parameter)
        elif parameter in _INDEX_PARAMETERS:
            choices.append(list(_INDEX_KEYS))
            labels.append(parameter)
        else:
            raise TypeError(f"{fn.__module__}.{fn.__name__}: no values known for parameter {parameter!r}")
    for key in keys or [None]:
        filled = [([key] if c is keys else c) for c in choices]
        filled = [sorted({key, C.DK_DTYPE_FLOAT32}) if c is None else c for c in filled]
        for args in itertools.product(*filled):
            shown = [CL_TYPES[a].name if isinstance(a, int) and a in CL_TYPES else str(a)
                     for a in args if not isinstance(a, (_CallStandIn, bool))]
            yield list(args), ",".join(shown)


def _options() -> str:
    return f"-DWG=256 {linalg_gemm._GPU_TILES[0].options()}"


def _inline():
    """Programs kernels build inline: (name, source, the function that builds
    it, whose dtypes it takes; None for the dtype-free copy)."""
    for width, key in layer.STORAGE_OF_WIDTH.items():
        yield f"layer.copy[{width} bytes]", layer.prelude("X", key, False) + layer._COPY, None
    yield ("training_conv._conv_grad", training_conv.VALID_RANGE + training_common.row_helpers("X")
           + training_conv._TEMPLATE, training_conv._conv_grad)
    yield ("training_rows._softmax_grad", training_common.row_helpers("X") + training_rows._SOFTMAX_TEMPLATE,
           training_rows._softmax_grad)


def programs() -> list[Program]:
    """Every program, each once (two builders may make the same text)."""
    claims = _claims()
    options = _options()
    found: dict[str, Program] = {}

    def keys_of(fn) -> list[int]:
        return sorted(claims.get(inspect.unwrap(fn), ()))

    def add(name: str, source: str) -> None:
        found.setdefault(source, Program(name, source, options))

    for module_name in family_modules():
        module = importlib.import_module(f"{KERNELS}.{module_name}")
        for name, builder in _builders(module):
            keys = keys_of(builder)
            if f"{module_name}.{name}" in _FLOAT_ONLY:
                keys = [k for k in keys if CL_TYPES[k].is_float]
            itemsizes = sorted({CL_TYPES[k].itemsize for k in keys})
            for args, label in _arguments(builder, keys, itemsizes):
                try:
                    source = builder(*args)
                except (KeyError, PluginError):  # a dtype the builder has no program for
                    continue
                add(f"{module_name}.{name}[{label}]", source)
    for name, body, builder in _inline():
        if builder is None:
            add(name, body)
            continue
        for key in keys_of(builder):
            add(f"{name}[{CL_TYPES[key].name}]", NO_CONTRACT + prelude("X", key, True) + body)
    return list(found.values())
