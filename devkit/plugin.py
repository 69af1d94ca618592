"""Finding, loading and version-checking plugins.

``load_plugin(name_or_path)`` resolves, in order (see docs/framework-guide.md):

1. an explicit path to a shared library;
2. a built-in name (cpu, opencl, cuda): always the built-in reference backend;
   a library or entry point of that name is skipped with a warning;
3. ``libdevkit_<name>.so`` in the ``DEVKIT_PLUGIN_PATH`` directories (absolute
   ones only: a relative entry is ignored with a warning);
4. installed packages' entry points in group ``devkit.plugins``, whose
   callable returns a library path or a Python plugin object (an object with a
   ``dk_plugin_init`` attribute: a cffi ``DK_PluginInitFn`` function pointer).

A device spec (``parse_device_spec``) is ``name:index`` and never a path.

Every plugin, whatever its origin, is driven through the same
``DK_PluginInit`` entry point and ``DK_DeviceApi`` table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import re
import threading
import warnings
from importlib import metadata
from pathlib import Path

from ._version import __version__
from .abi import (ABI_MAJOR, ABI_MINOR, C, ffi, field_end, field_present, open_library,
                  struct_fields)
from .driver import Device
from .dtypes import code_bits
from .errors import PluginLoadError, STATUS_NAMES, error_for_status
from .openblas import links_blas, single_threaded_blas

ENTRY_POINT_GROUP = "devkit.plugins"
PLUGIN_PATH_ENV = "DEVKIT_PLUGIN_PATH"

# The built-in plugins are found through these tables alone: the loader imports no backend.
_BACKENDS_DIR = Path(__file__).parent / "backends"
_BUILTIN_LIBRARIES = {"cpu": _BACKENDS_DIR / "cpu" / "libdevkit_cpu.so"}
# Built-ins written in Python: modules exposing ``dk_plugin_init``.
_BUILTIN_MODULES = {"opencl": "devkit.backends.opencl", "cuda": "devkit.backends.cuda"}
# Built-in names whose backend is not part of this release yet.
_BUILTIN_PENDING: dict[str, str] = {}

_API_FUNCTIONS = struct_fields("DK_DeviceApi")[1:]
# Functions appended after the 1.0 required set are optional by rule: a
# required addition would stop older plugins from loading (VERSIONING rule 5).
_FIRST_OPTIONAL = "copy_p2p"
REQUIRED_FUNCTIONS = tuple(_API_FUNCTIONS[: _API_FUNCTIONS.index(_FIRST_OPTIONAL)])
OPTIONAL_FUNCTIONS = tuple(_API_FUNCTIONS[_API_FUNCTIONS.index(_FIRST_OPTIONAL):])
# The graph section (ABI 1.1): all of it or none of it.
GRAPH_FUNCTIONS = tuple(fn for fn in _API_FUNCTIONS if fn.startswith("graph_"))
# The codegen section (ABI 1.2): all of it or none of it.
CODEGEN_FUNCTIONS = tuple(fn for fn in _API_FUNCTIONS if fn.startswith("codegen_"))
# Host memory registration (ABI 1.3): both or neither.
HOST_REGISTRATION_FUNCTIONS = ("mem_register_host", "mem_unregister_host")

_log = logging.getLogger("devkit.plugin")


class Plugin:
    """A loaded plugin: its identity, its function table and its devices.

    One instance per loaded library; never unloaded while the process runs.
    """

    def __init__(self, info, keepalive, source: str, location: str):
        self._info = info
        self._keepalive = keepalive
        self.source = source
        self.location = location
        self.name: str = _string(info.name) or Path(location).stem
        self.version: str = _string(info.version) if field_present(info, "DK_PluginInfo", "version") else ""
        self.device_type: str = (
            _string(info.device_type) if field_present(info, "DK_PluginInfo", "device_type") else self.name
        )
        self.abi_version: tuple[int, int] = (int(info.abi_major), int(info.abi_minor))
        self.api = info.api
        self._last_error = info.last_error_message
        self._devices: dict[int, object] = {}
        self._devices_lock = threading.Lock()
        self._kernel_index: dict[str, list] | None = None
        self._kernel_by_key: dict[tuple[str, int, int], object] = {}

    # -- the table -----------------------------------------------------------

    def has(self, function: str) -> bool:
        """Whether ``function`` is inside the table's struct_size and non-NULL."""
        return (field_present(self.api, "DK_DeviceApi", function)
                and getattr(self.api, function) != ffi.NULL)

    def call(self, function: str, *args) -> int:
        """Call a table function and raise on any status but OK and NOT_READY."""
        return check(self, getattr(self.api, function)(*args), function)

    def raise_status(self, status: int, function: str):
        raise error_for_status(status, f"{self.name}.{function}: {self.last_error_message()}")

    def last_error_message(self) -> str:
        if self._last_error == ffi.NULL:
            return "(the plugin gave no message)"
        message = self._last_error()
        return _string(message) or "(the plugin gave no message)"

    def kernel_entries(self, op: str | None = None) -> list:
        """The kernel table's DK_KernelEntry pointers (for one op, or all)."""
        index = self._kernel_index if self._kernel_index is not None else self._index_kernels()
        if op is not None:
            return list(index.get(op, ()))
        return [entry for entries in index.values() for entry in entries]

    def _index_kernels(self) -> dict[str, list]:
        index: dict[str, list] = {}
        by_key: dict[tuple[str, int, int], object] = {}
        if field_present(self._info, "DK_PluginInfo", "num_kernels") and self._info.kernels != ffi.NULL:
            for i in range(self._info.num_kernels):
                entry = self._info.kernels[i]
                if entry != ffi.NULL and entry.op != ffi.NULL and entry.fn != ffi.NULL:
                    op = _string(entry.op)
                    index.setdefault(op, []).append(entry)
                    if entry.dtype.lanes in (0, 1):  # the first entry for a key wins
                        by_key.setdefault((op, entry.dtype.code, entry.dtype.bits), entry)
        self._kernel_index, self._kernel_by_key = index, by_key
        return index

    def kernel_entry(self, op: str, dtype):
        """The entry for (op, key dtype), or None when the plugin has none."""
        if self._kernel_index is None:
            self._index_kernels()
        return self._kernel_by_key.get((op, *code_bits(dtype)))

    @property
    def kernels(self) -> list[tuple[str, int, int, int]]:
        """The kernel table as (op, dtype code, dtype bits, flags) tuples."""
        return [(_string(e.op), e.dtype.code, e.dtype.bits, int(e.flags)) for e in self.kernel_entries()]

    @property
    def has_collectives(self) -> bool:
        return self.has("ccl_comm_init")

    @property
    def has_graphs(self) -> bool:
        """Whether the plugin captures graphs itself (else the host replays them)."""
        return self.has("graph_begin_capture")

    @property
    def has_codegen(self) -> bool:
        """Whether the plugin compiles and launches generated code (ABI 1.2)."""
        return self.has("codegen_compile")

    @property
    def has_host_registration(self) -> bool:
        """Whether host memory can be registered as device memory (ABI 1.3): plans then
        run on NumPy inputs and outputs in place."""
        return self.has("mem_register_host")

    @property
    def name_is_shared(self) -> bool:
        """Whether another loaded plugin reports this name (a test build of cpu
        loaded by path, say): then only its location tells them apart."""
        with _registry_lock:
            return any(other is not self and other.name == self.name for other in _registry.values())

    # -- devices -------------------------------------------------------------

    @property
    def device_count(self) -> int:
        count = ffi.new("int32_t *")
        self.call("get_device_count", count)
        return int(count[0])

    def device(self, index: int = 0) -> Device:
        with self._devices_lock:
            if index not in self._devices:
                count = self.device_count
                if not 0 <= index < count:
                    raise IndexError(
                        f"device index {index} out of range: plugin '{self.name}' has {count} device(s)")
                self._devices[index] = Device(self, index)
            return self._devices[index]

    def devices(self) -> list[Device]:
        return [self.device(i) for i in range(self.device_count)]

    def __repr__(self) -> str:
        major, minor = self.abi_version
        return f"<devkit.Plugin {self.name!r} {self.version} ABI {major}.{minor} from {self.location}>"


def check(plugin: Plugin, status: int, function: str) -> int:
    """Turn a status returned by ``plugin.function`` into the matching exception."""
    if status not in (C.DK_OK, C.DK_NOT_READY):
        plugin.raise_status(status, function)
    return status


@dataclasses.dataclass(frozen=True)
class PluginDescriptor:
    """One discoverable plugin, as ``list_plugins()`` reports it."""

    name: str
    source: str  # "DEVKIT_PLUGIN_PATH", "entry point" or "built-in"
    location: str
    loads: bool
    abi_version: tuple[int, int] | None
    version: str | None
    device_count: int | None
    error: str | None


# -- loading --------------------------------------------------------------------

_registry: dict[str, Plugin] = {}
_registry_lock = threading.RLock()


def load_plugin(name_or_path: str | os.PathLike) -> Plugin:
    """Load a plugin by name or path; loading the same one twice returns the same object."""
    key = os.fspath(name_or_path)
    with _registry_lock:
        if key in _registry:
            return _registry[key]
        plugin = _resolve_and_load(key)
        _registry[key] = plugin
        return plugin


def _resolve_and_load(key: str) -> Plugin:
    if _looks_like_path(key):
        path = Path(key)
        if not path.exists():
            raise PluginLoadError(f"plugin library {key!r} does not exist")
        return _load_library(path, "path")
    if key in builtin_names():
        _warn_about_shadows(key)
        return _load_builtin(key)
    candidates = _plugin_path_candidates(key)
    if candidates:
        return _load_library(candidates[0], PLUGIN_PATH_ENV)
    entry_point = _entry_points().get(key)
    if entry_point is not None:
        return _load_entry_point(entry_point)
    raise PluginLoadError(
        f"no plugin named {key!r}: not a path, not libdevkit_{key}.so in {PLUGIN_PATH_ENV} "
        f"({os.environ.get(PLUGIN_PATH_ENV, 'unset')}), not an entry point in group "
        f"{ENTRY_POINT_GROUP!r}, and not a built-in ({', '.join(builtin_names())})")


def _warn_about_shadows(key: str) -> None:
    """A built-in name never loads a DEVKIT_PLUGIN_PATH library or an entry point:
    a file dropped in a listed directory must not replace a built-in."""
    shadows = [str(candidate) for candidate in _plugin_path_candidates(key)]
    entry_point = _entry_points().get(key)
    if entry_point is not None:
        shadows.append(f"entry point {entry_point.name} = {entry_point.value}")
    for shadow in shadows:
        warnings.warn(
            f"devkit: {shadow} is not loaded: {key!r} is a built-in plugin name, which always means "
            f"the built-in backend; load that plugin by its library path (devkit.load_plugin(path)) "
            f"or give it another name")


def _load_builtin(key: str) -> Plugin:
    if key in _BUILTIN_LIBRARIES:
        library = _BUILTIN_LIBRARIES[key]
        if not library.exists():
            raise PluginLoadError(
                f"built-in plugin {key!r} is not built ({library} is missing); "
                f"reinstall devkit with 'pip install -e .'")
        return _load_library(library, "built-in")
    if key in _BUILTIN_MODULES:
        return _load_builtin_module(key)
    raise PluginLoadError(f"plugin {key!r}: {_BUILTIN_PENDING[key]}")


def builtin_names() -> list[str]:
    return sorted({*_BUILTIN_LIBRARIES, *_BUILTIN_MODULES, *_BUILTIN_PENDING})


def _looks_like_path(key: str) -> bool:
    return os.sep in key or key.endswith(".so") or key.startswith(".")


def parse_device_spec(spec: str) -> tuple[str, int]:
    """``"name:index"`` (or ``"name"``, index 0) as (name, index). The name is a
    plugin name, never a path: a library is loaded by path with load_plugin."""
    name, sep, index = spec.rpartition(":")
    if not sep:
        name, index = spec, "0"
    if not name:
        raise ValueError(f"device spec {spec!r} has no plugin name (expected 'name:index', e.g. 'cpu:0')")
    if _looks_like_path(name):
        raise ValueError(
            f"device spec {spec!r} names a path; a device spec is 'name:index'. Load a library "
            f"explicitly: devkit.load_plugin({name!r}).device({index if sep else 0})")
    if not re.fullmatch(r"-?\d+", index):
        raise ValueError(f"device spec {spec!r}: the index {index!r} is not an integer "
                         f"(expected 'name:index', e.g. 'cpu:0')")
    return name, int(index)


def _plugin_path_dirs() -> list[Path]:
    """The absolute DEVKIT_PLUGIN_PATH entries. A relative one (".", "build")
    would resolve against whatever the current directory is: it is ignored."""
    dirs = []
    for part in os.environ.get(PLUGIN_PATH_ENV, "").split(os.pathsep):
        if not part:
            continue
        if not os.path.isabs(part):
            warnings.warn(f"devkit: {PLUGIN_PATH_ENV} entry {part!r} is ignored: it is not an absolute "
                          f"path, and a relative one would depend on the current directory")
            continue
        dirs.append(Path(part))
    return dirs


def _plugin_path_candidates(key: str) -> list[Path]:
    return [path for path in (directory / f"libdevkit_{key}.so" for directory in _plugin_path_dirs())
            if path.exists()]


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load_entry_point(entry_point: metadata.EntryPoint) -> Plugin:
    where = f"entry point {entry_point.name} = {entry_point.value}"
    try:
        target = entry_point.load()()
    except Exception as exc:
        raise PluginLoadError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
    if isinstance(target, (str, os.PathLike)):
        path = Path(target)
        if not path.exists():
            raise PluginLoadError(f"{where} returned {os.fspath(target)!r}, which does not exist")
        return _load_library(path, "entry point")
    init = getattr(target, "dk_plugin_init", None)
    if init is None or ffi.typeof(init) is not ffi.typeof("DK_PluginInitFn"):
        raise PluginLoadError(
            f"{where} returned {type(target).__name__}, which is neither a library path "
            f"nor an object with a 'dk_plugin_init' DK_PluginInitFn")
    return _initialise(init, keepalive=target, source="entry point", location=where)


def _load_builtin_module(key: str) -> Plugin:
    module_name = _BUILTIN_MODULES[key]
    try:
        module = importlib.import_module(module_name)
        init = module.dk_plugin_init  # the opencl package imports its table (pyopencl) here
    except ImportError as exc:
        raise PluginLoadError(
            f"built-in plugin {key!r} cannot be imported ({exc}); it needs pyopencl and an "
            f"OpenCL driver (see docs/opencl.md)") from exc
    return _initialise(init, keepalive=module, source="built-in",
                       location=module_name)


def _load_library(path: Path, source: str) -> Plugin:
    location = str(path.resolve())
    with _registry_lock:
        if location in _registry:
            return _registry[location]
    # A library that links scipy-openblas32's OpenBLAS (builds of the cpu
    # plugin: the built-in one, and the variants devkit.backends.cpu.build
    # makes) gets it loaded first, from the importable package, without its
    # thread pool (devkit.openblas). Only such a library: others never load it.
    blas = single_threaded_blas() if links_blas(location) else contextlib.nullcontext()
    try:
        with blas:
            library = open_library(location)
    except OSError as exc:
        raise PluginLoadError(f"cannot open plugin library {location}: {exc}") from exc
    try:
        init = library.DK_PluginInit
    except AttributeError:
        raise PluginLoadError(
            f"{location} is not a devkit plugin: it does not export DK_PluginInit") from None
    plugin = _initialise(init, keepalive=library, source=source, location=location)
    with _registry_lock:
        _registry[location] = plugin
    return plugin


class _LogSink:
    """Receives the plugin's log lines; the logger is renamed once the plugin names itself."""

    def __init__(self, location: str):
        guess = Path(location).stem.removeprefix("libdevkit_")
        self.logger = logging.getLogger(f"devkit.plugin.{guess}")


_LOG_LEVELS = {C.DK_LOG_DEBUG: logging.DEBUG, C.DK_LOG_INFO: logging.INFO,
               C.DK_LOG_WARNING: logging.WARNING, C.DK_LOG_ERROR: logging.ERROR}


@ffi.callback("DK_LogFn")
def _plugin_log(user_data, level, message):
    sink = ffi.from_handle(user_data)
    sink.logger.log(_LOG_LEVELS.get(level, logging.INFO), _string(message))


def _initialise(init, keepalive, source: str, location: str) -> Plugin:
    sink = _LogSink(location)
    sink_handle = ffi.new_handle(sink)
    host_name = ffi.new("char[]", f"devkit-python {__version__}".encode())
    host = ffi.new("DK_HostInfo *", {
        "struct_size": ffi.sizeof("DK_HostInfo"), "abi_major": ABI_MAJOR, "abi_minor": ABI_MINOR,
        "log": _plugin_log, "log_user_data": sink_handle, "host_name": host_name,
    })
    info = ffi.new("DK_PluginInfo *", {"struct_size": ffi.sizeof("DK_PluginInfo")})
    status = init(host, info)
    if status != C.DK_OK:
        message = "(the plugin gave no message)"
        if field_present(info, "DK_PluginInfo", "last_error_message") and info.last_error_message != ffi.NULL:
            message = _string(info.last_error_message()) or message
        raise PluginLoadError(
            f"{location}: DK_PluginInit failed with {STATUS_NAMES.get(status, status)}: {message}")
    _check_versions(info, location)
    plugin = Plugin(info, keepalive=(keepalive, sink_handle, host_name, host), source=source,
                    location=location)
    sink.logger = logging.getLogger(f"devkit.plugin.{plugin.name}")
    _log.debug("loaded %r", plugin)
    return plugin


def _check_versions(info, location: str) -> None:
    needed = field_end("DK_PluginInfo", "api")
    if info.struct_size < needed:
        raise PluginLoadError(
            f"{location}: DK_PluginInfo.struct_size is {info.struct_size} bytes; "
            f"ABI {ABI_MAJOR}.{ABI_MINOR} needs at least {needed} (through the 'api' field)")
    if info.abi_major != ABI_MAJOR:
        error = PluginLoadError(
            f"{location}: plugin implements devkit ABI {info.abi_major}.{info.abi_minor} but this "
            f"host implements ABI {ABI_MAJOR}.{ABI_MINOR}; the major versions must match")
        error.abi_version = (int(info.abi_major), int(info.abi_minor))
        raise error
    api = info.api
    if api == ffi.NULL:
        raise PluginLoadError(f"{location}: DK_PluginInit returned a NULL DK_DeviceApi table")
    missing = [fn for fn in REQUIRED_FUNCTIONS if api.struct_size < field_end("DK_DeviceApi", fn)]
    if missing:
        raise PluginLoadError(
            f"{location}: DK_DeviceApi table is too short ({api.struct_size} bytes, ABI "
            f"{ABI_MAJOR}.{ABI_MINOR} requires {field_end('DK_DeviceApi', REQUIRED_FUNCTIONS[-1])}); "
            f"missing required functions: {', '.join(missing)}")
    null = [fn for fn in REQUIRED_FUNCTIONS if getattr(api, fn) == ffi.NULL]
    if null:
        raise PluginLoadError(
            f"{location}: required DK_DeviceApi functions are NULL: {', '.join(null)}")
    for section, functions in (("graph", GRAPH_FUNCTIONS), ("codegen", CODEGEN_FUNCTIONS),
                               ("host registration", HOST_REGISTRATION_FUNCTIONS)):
        present = [fn for fn in functions
                   if api.struct_size >= field_end("DK_DeviceApi", fn) and getattr(api, fn) != ffi.NULL]
        if present and len(present) != len(functions):
            absent = [fn for fn in functions if fn not in present]
            raise PluginLoadError(
                f"{location}: the {section} section is partial: it has {', '.join(present)} but not "
                f"{', '.join(absent)} (NULL or past the table's {api.struct_size} bytes); a plugin "
                f"implements all {len(functions)} {section} functions or none")


def list_plugins() -> list[PluginDescriptor]:
    """Every discoverable plugin, whether it loads, and why not."""
    builtins = builtin_names()
    candidates: dict[str, tuple[str, str]] = {}
    for directory in _plugin_path_dirs():
        for library in sorted(directory.glob("libdevkit_*.so")):
            name = library.name[len("libdevkit_"):-len(".so")]
            if name not in builtins:  # load_plugin(name) warns that it is skipped
                candidates.setdefault(name, (PLUGIN_PATH_ENV, str(library)))
    for name, entry_point in _entry_points().items():
        if name not in builtins:
            candidates.setdefault(name, ("entry point", entry_point.value))
    for name in builtins:
        location = str(_BUILTIN_LIBRARIES.get(name, _BACKENDS_DIR / name))
        candidates[name] = ("built-in", location)
    descriptors = []
    for name, (source, location) in candidates.items():
        try:
            plugin = load_plugin(name)
            descriptors.append(PluginDescriptor(
                name, source, location, True, plugin.abi_version, plugin.version,
                plugin.device_count, None))
        except Exception as exc:  # a broken plugin is reported, never raised
            descriptors.append(PluginDescriptor(
                name, source, location, False, getattr(exc, "abi_version", None), None, None,
                str(exc)))
    return descriptors


def _string(cdata) -> str:
    if cdata == ffi.NULL:
        return ""
    return ffi.string(cdata).decode("utf-8", errors="replace")
